// The selftest's calibration: what cuMemAddressReserve/Free, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap and cuMemRelease cost on this driver, per handle size (the
// granularity to 1 GiB) and, for cuMemSetAccess and cuMemUnmap, per number of granularity-sized
// mappings one call covers (1 to 512). Each point is the median of several calls.
#pragma once

#include "cost_table_json.hpp"
#include "selftest_env.hpp"

#include <functional>
#include <string>

namespace expanse::tools::selftest {

struct CalibrationOptions {
  int repetitions = 5;
  size_t max_handle = size_t{1} << 30;
  int max_range = 512;
  size_t budget = 0;  // bytes the calibration may hold at once (free memory / 2)
  std::function<void(double fraction, const std::string& phase)> progress;
};

// The caller holds a Current. Throws Failed when a call fails (the driver's code named).
CostTableSamples calibrate(const Env& e, const CalibrationOptions& o);

// The handle sizes calibrate() measures: granularity * 4^k below max_handle, then max_handle
// (rounded down to the granularity), each at most budget.
std::vector<size_t> calibration_sizes(size_t granularity, size_t max_handle, size_t budget);

}  // namespace expanse::tools::selftest
