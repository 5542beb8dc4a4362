#include "info.hpp"

#include "conf/config.hpp"
#include "driver/driver.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"
#include "workloads/reserve_probe.hpp"

#include <algorithm>
#include <sstream>

namespace expanse::tools {
namespace {

using driver::EntryPoint;
using Json = nlohmann::ordered_json;

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

Json size_or_null(size_t v) { return v == conf::kNoLimit ? Json(nullptr) : Json(v); }

// The allocator options a device gets, with the values DeviceAllocator derives from the
// capacity when an option is 0 (see core/base/options.hpp).
Json effective_options(const conf::Config& conf, size_t capacity, size_t granularity) {
  conf::AllocatorOptions o = conf::options_for_device(conf, capacity);
  const size_t page = o.page_size != 0 ? o.page_size : granularity;
  const size_t cap = std::max(capacity, page);
  Json j;
  j["page_size_bytes"] = page;
  j["limit_bytes"] = size_or_null(o.limit);
  j["release_threshold_bytes"] = size_or_null(o.release_threshold);
  j["small_max_bytes"] = o.small_max;
  j["va_size_bytes"] = o.va_size != 0 ? o.va_size : 2 * cap;
  j["small_va_size_bytes"] =
      o.small_va_size != 0 ? o.small_va_size : std::max<size_t>(cap / 4, size_t{1} << 30);
  j["va_budget_bytes"] = o.va_budget != 0 ? o.va_budget : 64 * cap;
  j["lifo_depth"] = o.lifo_depth;
  j["reclaim_before_create"] = o.reclaim_before_create;
  return j;
}

std::string size_text(const Json& v) {
  if (v.is_null()) return "none";
  return conf::format_size(v.get<size_t>());
}

}  // namespace

Json gather_info(const std::string& conf_text) {
  const conf::Config conf = conf::parse_config(conf_text);
  std::unique_ptr<driver::LoadedDriver> drv;
  try {
    drv = driver::select_driver(conf_text, true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(e.what(), static_cast<int>(e.code()));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  const auto& t = drv->table();
  Json out;
  const bool sim = drv->kind() == driver::DriverKind::sim;
  Json d;
  d["kind"] = sim ? "sim" : "cuda";
  d["description"] = drv->description();
  int version = 0;
  drv->check(t.driver_get_version(&version), EntryPoint::driver_get_version);
  d["version"] = version_text(version);
  if (const driver::SimConfig* sim_config = drv->sim_config(); sim_config != nullptr) {
    const driver::SimConfig& c = *sim_config;
    d["sim"] = {{"devices", c.devices},
                {"capacity_bytes", c.capacity},
                {"granularity_bytes", c.granularity},
                {"backing", c.backing}};
  }
  // Optional entry points this driver lacks (older than them): what expanse does without them.
  Json missing = Json::array();
  for (EntryPoint e : drv->missing()) {
    missing.push_back({{"name", driver::entry_point_name(e)},
                       {"since", version_text(driver::entry_point_version(e))}});
  }
  d["missing_entry_points"] = missing;
  out["driver"] = d;

  int count = 0;
  drv->check(t.device_get_count(&count), EntryPoint::device_get_count);
  Json devices = Json::array();
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    drv->check(t.device_get(&dev, i), EntryPoint::device_get);
    char name[256] = {};
    drv->check(t.device_get_name(name, sizeof name - 1, dev), EntryPoint::device_get_name);
    size_t total = 0;
    drv->check(t.device_total_mem(&total, dev), EntryPoint::device_total_mem);
    int vmm = 0;
    drv->check(t.device_get_attribute(
                   &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
               EntryPoint::device_get_attribute);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = i;  // CUmemLocation names a device by ordinal, not CUdevice
    size_t gmin = 0, grec = 0;
    if (vmm != 0) {
      drv->check(t.mem_get_allocation_granularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 EntryPoint::mem_get_allocation_granularity);
      drv->check(
          t.mem_get_allocation_granularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          EntryPoint::mem_get_allocation_granularity);
    }
    size_t free_b = 0, total_b = 0;
    CUcontext ctx = nullptr;
    drv->check(t.device_primary_ctx_retain(&ctx, dev), EntryPoint::device_primary_ctx_retain);
    CUresult r = t.ctx_push_current(ctx);
    if (r == CUDA_SUCCESS) {
      r = t.mem_get_info(&free_b, &total_b);
      CUcontext popped = nullptr;
      t.ctx_pop_current(&popped);
    }
    t.device_primary_ctx_release(dev);
    drv->check(r, EntryPoint::mem_get_info);

    // Pinned host memory (expanse_host_*): HOST_NUMA pages where attribute 141 says so, else the
    // cuMemHostRegister fallback and what it drops.
    int host_vmm = 0, host_node = -1;
    t.device_get_attribute(&host_vmm,
                           CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    t.device_get_attribute(&host_node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);

    Json j;
    j["index"] = i;
    j["name"] = std::string(name);
    Json host;
    host["path"] = host_vmm != 0 ? "vmm" : "registered";
    host["numa_node"] = host_node < 0 ? 0 : host_node;
    if (host_vmm == 0) {
      host["drops"] = "pages are not reused between blocks (each pins anew) nor placed on the node";
    }
    j["pinned_host_memory"] = host;
    j["capacity_bytes"] = total;
    j["free_bytes"] = free_b;
    j["vmm_supported"] = vmm != 0;
    j["granularity_bytes"] = gmin;
    j["recommended_granularity_bytes"] = grec;
    j["allocator"] = effective_options(conf, total, gmin != 0 ? gmin : size_t{2} << 20);
    // EXPANSE_CONF reserve, made for real here and given back: what a job would hold now.
    const replay::ReserveProbe rp = replay::probe_reservation(*drv, i, conf, total);
    if (!rp.spec.empty()) {
      Json rj;
      rj["spec"] = rp.spec;
      rj["asked_bytes"] = rp.asked_bytes;
      rj["held_bytes"] = rp.held_bytes;
      rj["partial"] = rp.error.empty() && rp.held_bytes < rp.asked_bytes;
      if (!rp.error.empty()) rj["error"] = rp.error;
      j["reserve"] = rj;
    }
    devices.push_back(j);
  }
  out["devices"] = devices;
  out["expanse_conf"] = conf_text;
  return out;
}

std::string format_info(const Json& info) {
  std::ostringstream o;
  const Json& d = info["driver"];
  o << "driver   " << d["kind"].get<std::string>() << " (" << d["description"].get<std::string>()
    << "), version " << d["version"].get<std::string>() << "\n";
  if (d.contains("missing_entry_points") && !d["missing_entry_points"].empty()) {
    o << "missing  ";
    const char* sep = "";
    for (const Json& m : d["missing_entry_points"]) {
      o << sep << m["name"].get<std::string>() << " (CUDA " << m["since"].get<std::string>()
        << ")";
      sep = ", ";
    }
    bool no_ids = false;
    for (const Json& m : d["missing_entry_points"]) no_ids = no_ids || m["name"] == "cuStreamGetId";
    o << ": optional, expanse works without them"
      << (no_ids ? " (without stream ids nothing freed is reused before a fence or a context "
                   "sync)"
                 : "")
      << "\n";
  }
  const std::string conf = info["expanse_conf"].get<std::string>();
  o << "config   EXPANSE_CONF=" << (conf.empty() ? "(unset)" : conf) << "\n";
  o << "devices  " << info["devices"].size() << "\n";
  for (const Json& dev : info["devices"]) {
    o << "  [" << dev["index"].get<int>() << "] " << dev["name"].get<std::string>() << ": "
      << size_text(dev["capacity_bytes"]) << " (" << size_text(dev["free_bytes"]) << " free), "
      << "granularity " << size_text(dev["granularity_bytes"]) << " (recommended "
      << size_text(dev["recommended_granularity_bytes"]) << "), VMM "
      << (dev["vmm_supported"].get<bool>() ? "yes" : "NO") << "\n";
    const Json& h = dev["pinned_host_memory"];
    o << "      pinned host memory: "
      << (h["path"] == "vmm" ? "HOST_NUMA pages through the VMM API, NUMA node "
                             : "the cuMemHostRegister fallback (attribute 141 is 0: ")
      << (h["path"] == "vmm" ? std::to_string(h["numa_node"].get<int>())
                             : h["drops"].get<std::string>() + ")")
      << "\n";
    const Json& a = dev["allocator"];
    o << "      allocator: page " << size_text(a["page_size_bytes"]) << ", limit "
      << size_text(a["limit_bytes"]) << ", release threshold "
      << size_text(a["release_threshold_bytes"]) << ", small blocks up to "
      << size_text(a["small_max_bytes"]) << "\n"
      << "                 VA " << size_text(a["va_size_bytes"]) << " per reservation (small "
      << size_text(a["small_va_size_bytes"]) << "), VA budget " << size_text(a["va_budget_bytes"])
      << ", LIFO depth " << a["lifo_depth"].get<size_t>() << ", "
      << (a["reclaim_before_create"].get<bool>() ? "reclaim before create"
                                                 : "create before reclaim")
      << "\n";
    if (dev.contains("reserve")) {
      const Json& r = dev["reserve"];
      o << "      reserve:   " << r["spec"].get<std::string>() << ": ";
      if (r.contains("error")) {
        o << "cannot be had now: " << r["error"].get<std::string>() << "\n";
      } else {
        o << size_text(r["held_bytes"]) << " held now";
        if (r["partial"].get<bool>()) {
          o << " of " << size_text(r["asked_bytes"]) << " asked (partial: reserve_partial:true)";
        }
        o << " (tried and given back)\n";
      }
    }
  }
  return o.str();
}

}  // namespace expanse::tools
