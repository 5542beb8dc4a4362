// The driver interface: choosing and loading a driver (the real libcuda.so.1 or the in-process
// sim), and what was loaded. The one driver header that tools/ (`info`, `selftest`, the cost
// table and report code) and bench/ use: it brings the driver vocabulary of driver_api/ with it
// (the entry points, the DriverTable, the cost model), and names the sim's configuration as
// SimConfig, so that no caller includes sim/ to load or describe a sim.
#pragma once

#include "driver_api/cost_model.hpp"
#include "driver_api/driver_table.hpp"
#include "sim/sim.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace expanse::driver {

enum class DriverKind { cuda, sim };

// The sim's devices and behaviour (sim/sim.hpp): what load_sim takes and sim_config() reports.
using SimConfig = sim::SimConfig;

// A failing driver call: names the entry point and the CUresult's name and description.
class driver_error : public std::runtime_error {
 public:
  driver_error(const std::string& what, CUresult code) : std::runtime_error(what), code_(code) {}
  CUresult code() const noexcept { return code_; }

 private:
  CUresult code_;
};

// A filled table plus where it came from. Owns the dlopen handle (closed on destruction).
class LoadedDriver {
 public:
  LoadedDriver(DriverTable table, DriverKind kind, std::string description, void* dl_handle,
               int driver_version = 0, std::optional<SimConfig> sim = std::nullopt)
      : table_(table),
        kind_(kind),
        description_(std::move(description)),
        dl_(dl_handle),
        driver_version_(driver_version),
        sim_(std::move(sim)) {}
  ~LoadedDriver();
  LoadedDriver(const LoadedDriver&) = delete;
  LoadedDriver& operator=(const LoadedDriver&) = delete;

  const DriverTable& table() const noexcept { return table_; }
  DriverKind kind() const noexcept { return kind_; }
  // "cuda: libcuda.so.1, driver 13.0" / "sim: EXPANSE_CONF driver:sim, 1 device x 80 GiB".
  const std::string& description() const noexcept { return description_; }
  // cuDriverGetVersion's answer (12020 for a 12.2 driver); 0 if it could not be read.
  int driver_version() const noexcept { return driver_version_; }
  // The configuration the in-process sim was loaded with; nullptr for any other driver.
  const SimConfig* sim_config() const noexcept { return sim_ ? &*sim_ : nullptr; }

  // Whether entry point e was loaded. Required ones always are; an optional one is null where
  // the driver is older than the entry point's version or does not provide it.
  bool has(EntryPoint e) const noexcept { return table_.has(e); }
  // The optional entry points this driver lacks, in list order (for `expanse info`).
  std::vector<EntryPoint> missing() const;

  // "cuMemMap: CUDA_ERROR_INVALID_VALUE (invalid argument)" for a failing call.
  std::string describe_error(EntryPoint e, CUresult r) const;
  // Throws driver_error for r != CUDA_SUCCESS, with describe_error's text plus context.
  void check(CUresult r, EntryPoint e, const char* context = nullptr) const;

 private:
  DriverTable table_;
  DriverKind kind_;
  std::string description_;
  void* dl_;
  int driver_version_;
  std::optional<SimConfig> sim_;
};

// Opens a libcuda-compatible library with dlopen (default "libcuda.so.1"), resolves every entry
// point through cuGetProcAddress_v2 (falling back to dlsym of the exported symbol), and calls
// cuInit(0). Entry points newer than cuDriverGetVersion are not asked for (an old driver could
// answer with an older, ABI-incompatible variant); optional ones the driver lacks stay null.
// Throws driver_error carrying the dlopen error, a missing required symbol, or cuInit's code.
std::unique_ptr<LoadedDriver> load_cuda(const std::string& library = "libcuda.so.1");

// Resets the in-process sim with cfg and returns its table (cuInit already called). As for a
// real driver, optional entry points newer than cfg.driver_version are left null, and one
// older than a required entry point throws driver_error.
std::unique_ptr<LoadedDriver> load_sim(const SimConfig& cfg, const std::string& why);

// EXPANSE_CONF's driver selection. mode: "auto" | "cuda" | "sim". With "auto", a working
// libcuda.so.1 is used; otherwise, if allow_sim_fallback, the sim (the CLI's choice, which it
// reports), else the load_cuda error is thrown (a library never hands host memory to a CUDA
// application silently). conf is the whole EXPANSE_CONF text (for sim_* and driver_library).
std::unique_ptr<LoadedDriver> select_driver(const std::string& conf, bool allow_sim_fallback);

}  // namespace expanse::driver
