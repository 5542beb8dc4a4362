#include "driver/driver.hpp"
#include "conf/env_config.hpp"
#include "driver/driver_trace.hpp"

#include <dlfcn.h>

#include <string>

namespace expanse::driver {
namespace {

using GetProcAddressV2 = decltype(&::cuGetProcAddress_v2);

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

std::vector<EntryPoint> LoadedDriver::missing() const {
  std::vector<EntryPoint> out;
  for (int i = 0; i < kEntryPointCount; ++i) {
    const auto e = static_cast<EntryPoint>(i);
    if (!has(e)) out.push_back(e);
  }
  return out;
}

std::unique_ptr<LoadedDriver> load_cuda(const std::string& library) {
  const TraceMode trace = trace_mode_from_env();
  dlerror();
  void* dl = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    const char* err = dlerror();
    throw driver_error("cannot load the CUDA driver '" + library + "': " +
                           (err != nullptr ? err : "dlopen failed"),
                       CUDA_ERROR_SHARED_OBJECT_INIT_FAILED);
  }
  // From here on the handle must be closed on any failure.
  struct Closer {
    void* dl;
    ~Closer() {
      if (dl != nullptr) dlclose(dl);
    }
  } closer{dl};

  DriverTable table;
  auto gpa = reinterpret_cast<GetProcAddressV2>(dlsym(dl, "cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(
      dlsym(dl, "cuDriverGetVersion"));
  int driver_version = 0;
  if (get_version != nullptr) get_version(&driver_version);

  for (int i = 0; i < kEntryPointCount; ++i) {
    auto e = static_cast<EntryPoint>(i);
    void* fn = nullptr;
    // A driver older than the variant is never asked: cuGetProcAddress would hand out the newest
    // variant it knows, whose ABI may differ from the one we call.
    const bool too_new = driver_version > 0 && entry_point_version(e) > driver_version;
    if (too_new) {
      if (!entry_point_required(e)) continue;
      throw driver_error("the CUDA driver '" + library + "' (version " +
                             version_text(driver_version) + ") is older than " +
                             entry_point_symbol(e) + " (CUDA " +
                             version_text(entry_point_version(e)) + ")",
                         CUDA_ERROR_NOT_FOUND);
    }
    if (gpa != nullptr) {
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
      // Ask for the exact ABI variant we were compiled against, not the newest one.
      CUresult r = gpa(entry_point_name(e), &fn, entry_point_version(e),
                       CU_GET_PROC_ADDRESS_DEFAULT, &status);
      if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) fn = nullptr;
    }
    if (fn == nullptr) fn = dlsym(dl, entry_point_symbol(e));
    if (fn == nullptr && !entry_point_required(e)) continue;
    if (fn == nullptr) {
      throw driver_error("the CUDA driver '" + library + "' (version " +
                             version_text(driver_version) + ") lacks " + entry_point_symbol(e),
                         CUDA_ERROR_NOT_FOUND);
    }
    *table.slot(e) = fn;
  }

  CUresult r = table.init(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    table.get_error_name(r, &name);
    const char* text = nullptr;
    table.get_error_string(r, &text);
    throw driver_error("cuInit failed in '" + library + "': " +
                           (name != nullptr ? name : std::to_string(static_cast<int>(r))) +
                           (text != nullptr ? std::string(" (") + text + ")" : std::string()),
                       r);
  }
  closer.dl = nullptr;
  return std::make_unique<LoadedDriver>(
      traced_table(table, trace), DriverKind::cuda, "cuda: " + library + ", driver " + version_text(driver_version),
      dl, driver_version);
}

std::unique_ptr<LoadedDriver> load_sim(const SimConfig& cfg, const std::string& why) {
  // The sim's table has everything; a driver of cfg.driver_version would lack what is newer.
  const TraceMode trace = trace_mode_from_env();
  DriverTable table = sim::table();
  for (int i = 0; i < kEntryPointCount; ++i) {
    const auto e = static_cast<EntryPoint>(i);
    if (entry_point_version(e) <= cfg.driver_version) continue;
    if (entry_point_required(e)) {
      throw driver_error("the sim's driver version " + version_text(cfg.driver_version) +
                             " (sim_driver_version) is older than " + entry_point_symbol(e) +
                             " (CUDA " + version_text(entry_point_version(e)) + ")",
                         CUDA_ERROR_NOT_FOUND);
    }
    *table.slot(e) = nullptr;
  }
  sim::reset(cfg);
  CUresult r = table.init(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    table.get_error_name(r, &name);
    throw driver_error(std::string("cuInit failed in the sim: ") +
                           (name != nullptr ? name : "unknown error"),
                       r);
  }
  std::string desc = "sim: " + why + ", " + std::to_string(cfg.devices) + " device" +
                     (cfg.devices == 1 ? "" : "s") + " x " + conf::format_size(cfg.capacity) +
                     ", granularity " + conf::format_size(cfg.granularity);
  if (!cfg.backing) desc += ", no host memory behind pages";
  if (cfg.driver_version != SimConfig{}.driver_version)
    desc += ", driver " + version_text(cfg.driver_version);
  return std::make_unique<LoadedDriver>(traced_table(table, trace), DriverKind::sim, desc, nullptr,
                                        cfg.driver_version, cfg);
}

std::unique_ptr<LoadedDriver> select_driver(const std::string& conf, bool allow_sim_fallback) {
  std::string mode = "auto";
  std::string library = "libcuda.so.1";
  for (const auto& [key, value] : conf::parse_pairs(conf)) {
    if (key == "driver") {
      if (value != "auto" && value != "cuda" && value != "sim") {
        throw std::invalid_argument("EXPANSE_CONF: key 'driver': '" + value +
                                    "' is not one of auto, cuda, sim");
      }
      mode = value;
    } else if (key == "driver_library") {
      library = value;
    }
  }
  if (mode == "sim") return load_sim(sim::sim_config_from_string(conf), "EXPANSE_CONF driver:sim");
  if (mode == "cuda") return load_cuda(library);
  try {
    return load_cuda(library);
  } catch (const driver_error& e) {
    if (!allow_sim_fallback) throw;
    return load_sim(sim::sim_config_from_string(conf),
                    std::string("no usable GPU (") + e.what() + ")");
  }
}

}  // namespace expanse::driver
