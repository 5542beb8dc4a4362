// Modeled GPU driver time per call: a per-call part and a per-byte part for every entry point.
//
// Each entry point has a curve of (bytes, ns) samples: the cost of one call on one handle /
// mapping of that many bytes. Between samples the cost is linear; beyond the last it follows the
// last two samples' slope; a single sample is flat. So "28 us + 0.24 us/MiB" is two samples, and a
// table measured by `expanse selftest` is many. Calls over a range of several mappings
// (cuMemSetAccess, cuMemUnmap) may also have a curve over the mapping count, measured with
// granularity-sized mappings; without one, a range costs one call per mapping.
//
// The default is the H100 table (see h100()); `expanse selftest` measures a table, and the CLI's
// `--cost-table FILE` reads one (its JSON form lives with the CLI, not in this layer).
#pragma once

#include "driver_api/entry_points.hpp"

#include <cstddef>
#include <vector>

namespace expanse::driver {

struct CostSample {
  double x = 0;   // bytes (per-handle curve) or mappings (range curve)
  double ns = 0;  // nanoseconds for one call
};

class CostModel {
 public:
  // Every entry point 0.5 us flat (bookkeeping calls), no range curves.
  CostModel();

  // Published H100 80GB measurements (the built-in default; see cost_model.cpp).
  static const CostModel& h100() noexcept;

  // The process-wide model used by the allocator's stats and the sim unless told otherwise.
  // set_default() is for start-up (CLI --cost-table) and tests; not synchronized with readers.
  static const CostModel& get_default() noexcept;
  static void set_default(const CostModel& m);

  // ns for one successful call covering `bytes` over `mappings` handles (mappings >= 1).
  double cost_ns(EntryPoint e, size_t bytes = 0, size_t mappings = 1) const noexcept;

  // Replace an entry point's curves. Samples are sorted by x; x must be >= 0, ns >= 0.
  void set_flat(EntryPoint e, double ns);
  void set_linear(EntryPoint e, double per_call_ns, double per_mib_ns);
  void set_samples(EntryPoint e, std::vector<CostSample> by_bytes);
  void set_range_samples(EntryPoint e, std::vector<CostSample> by_mappings);
  // The same, measured with mappings of `mapping_bytes` each (selftest's tables); without it the
  // range curve counts as measured with the smallest per-handle sample.
  void set_range_samples(EntryPoint e, std::vector<CostSample> by_mappings, double mapping_bytes);

  const std::vector<CostSample>& samples(EntryPoint e) const noexcept {
    return by_bytes_[static_cast<int>(e)];
  }
  const std::vector<CostSample>& range_samples(EntryPoint e) const noexcept {
    return by_mappings_[static_cast<int>(e)];
  }


 private:
  std::vector<CostSample> by_bytes_[kEntryPointCount];
  std::vector<CostSample> by_mappings_[kEntryPointCount];
  double range_bytes_[kEntryPointCount] = {};  // < 0: the smallest per-handle sample's x
};

// Linear interpolation over sorted samples, extrapolated from the last two beyond the ends
// (never below zero).
double interpolate(const std::vector<CostSample>& s, double x) noexcept;

}  // namespace expanse::driver
