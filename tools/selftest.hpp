// `expanse selftest`: proves the driver in use (a real GPU's libcuda.so.1, or the sim) does what
// expanse relies on, stresses it, and measures what its VMM calls cost.
//
// It is a tool over the driver seam (driver/: the DriverTable of entry points, loaded the way the
// library loads it), not over the allocator: the checks and the calibration call the entry points
// themselves, so they run on any machine without a test framework. The stress is `expanse
// stress` (the allocator through the same driver) sized to the device's free memory.
#pragma once

#include "cost_table_json.hpp"
#include "workloads/stress.hpp"

#include "driver/driver.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace expanse::tools {

using replay::run_stress;
using replay::StressOptions;
using replay::StressResult;


struct SelftestOptions {
  std::string conf;       // EXPANSE_CONF
  int device = 0;         // ordinal
  int repetitions = 5;    // calibration: median of this many calls per point
  size_t max_handle = size_t{1} << 30;  // calibration: the largest handle (bounded by free / 2)
  int max_range = 512;                  // calibration: the most mappings in one range call
  bool stress = true;
  std::function<void(double fraction, const std::string& phase)> progress;
};

struct CheckResult {
  std::string name;
  bool ok = false;
  std::string message;  // what was verified, or what the driver did instead
};

struct SelftestReport {
  std::string driver;  // LoadedDriver::description()
  bool sim = false;    // the in-process sim (no library loaded)
  std::string driver_version;
  std::string device;  // cuDeviceGetName
  int ordinal = 0;
  size_t capacity = 0;  // cuDeviceTotalMem
  size_t free = 0;      // cuMemGetInfo at the start
  size_t granularity = 0;

  std::vector<CheckResult> checks;
  bool stress_ran = false;
  StressResult stress;
  std::string stress_error;  // an exception the stress threw (usage, driver)
  CostTableSamples cost_table;
  int repetitions = 0;
  double calibration_seconds = 0;
  double wall_seconds = 0;

  bool stress_ok() const {
    return !stress_ran || (stress_error.empty() && stress.allocated && stress.verified);
  }
  bool ok() const;
};

// Loads the driver EXPANSE_CONF selects (the sim when no GPU, as the CLI does, and says so),
// runs the checks, the calibration and the stress. Throws expanse::usage_error for a bad
// EXPANSE_CONF and expanse::driver_failure when no driver loads; everything the driver does
// wrong after that is a failed check in the report.
SelftestReport run_selftest(const SelftestOptions& o);

// The same over a driver already loaded (tests give it a driver that breaks a rule). The stress
// still loads its own driver from o.conf; set o.stress = false to skip it.
SelftestReport run_selftest(const driver::LoadedDriver& drv, const SelftestOptions& o);

nlohmann::ordered_json selftest_json(const SelftestReport& r);
std::string selftest_text(const SelftestReport& r);

}  // namespace expanse::tools
