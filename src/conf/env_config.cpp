#include "conf/env_config.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace expanse::conf {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

}  // namespace

const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = {
      "driver",           // auto | cuda | sim
      "sim_devices",      // number of simulated devices
      "sim_capacity",     // physical memory per simulated device
      "sim_granularity",  // allocation granularity of the simulated devices
      "sim_backing",      // true: host memory behind sim pages; false: bookkeeping only
      "page_size",        // allocator page size (a multiple of the device granularity)
      "limit",            // cap on mapped memory: bytes or a fraction of capacity
      "host_limit",       // cap on pinned host pages per NUMA node (expanse_host_*)
      "release_threshold",  // cached memory above this is returned to the driver
      "reclaim_first",    // reclaim pages under free memory before creating new ones
      "va_size",          // bytes of VA reserved per reservation
      "va_budget",        // most VA the allocator may reserve per device
      "driver_library",   // path of the libcuda-compatible library for driver:cuda
      "sim_driver_version",  // cuDriverGetVersion of the sim (13000); newer entry points absent
      "sim_peer_access",     // cuDeviceCanAccessPeer between distinct sim devices
      "sim_posix_fd",        // sim devices support POSIX file-descriptor handles
      "sim_rdma",            // sim devices support GPUDirect RDMA with VMM
      "sim_host_capacity",   // pinned host memory (cuMemHostAlloc, HOST_NUMA handles) in all
      "sim_host_numa",       // HOST_NUMA handles through cuMemCreate (attribute 141)
      "sim_numa_nodes",      // host NUMA nodes of the sim
      "sim_gpu_lag",         // ticks of the host clock the sim GPU runs behind (replays tick per operation)
      "peer_access",      // auto | none: grant peers that can access a device its memory
      "null_stream",      // legacy | per_thread: what a NULL stream argument means
      "rdma",             // auto | off: ask cuMemCreate for GPUDirect RDMA where supported
      "registrable",      // every default-pool block its own exportable handle (ipc, NCCL)
      "max_handle_size",  // largest physical handle backing a block (page_size: one per page)
      "high_water_slack",  // physical above peak touched before reclaiming first (none: off)
      "reserve",          // physical memory held from first use: a size, a fraction, or free
      "reserve_margin",   // reserve:free leaves this much of the free memory to others
      "reserve_partial",  // keep what the driver gave when a reservation cannot be had whole
      "reserve_handle_size",  // the largest handles a reservation is made of (max_handle_size)
      "reserve_may_dip",  // reshape reserved handles by releasing first (another process may take them)
      "thread_cache",      // bytes of freed blocks one thread's cache holds per device (0: off)
      "thread_cache_entries",  // blocks one thread's cache holds per device (0: off)
  };
  return keys;
}

std::vector<std::pair<std::string, std::string>> parse_pairs(std::string_view conf) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto& keys = known_keys();
  size_t pos = 0;
  while (pos <= conf.size()) {
    size_t comma = conf.find(',', pos);
    if (comma == std::string_view::npos) comma = conf.size();
    std::string_view item = trim(conf.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      fail("EXPANSE_CONF: item '" + std::string(item) + "' is not key:value");
    }
    std::string key(trim(item.substr(0, colon)));
    std::string value(trim(item.substr(colon + 1)));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
      fail("EXPANSE_CONF: unknown key '" + key + "' (known keys: " + list + ")");
    }
    if (value.empty()) fail("EXPANSE_CONF: key '" + key + "' has an empty value");
    for (const auto& [k, v] : out) {
      if (k == key) fail("EXPANSE_CONF: key '" + key + "' is given twice");
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

size_t parse_size(std::string_view text) {
  std::string_view s = trim(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string number(s.substr(0, i));
  std::string unit(trim(s.substr(i)));
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") {
    fail("size '" + std::string(text) + "' does not start with a number");
  }
  struct Unit {
    const char* name;
    double factor;
  };
  static const Unit units[] = {{"", 1.0},         {"B", 1.0},         {"KiB", 1024.0},
                               {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
                               {"KB", 1e3},        {"MB", 1e6},        {"GB", 1e9},
                               {"TB", 1e12},       {"K", 1024.0},      {"M", 1048576.0},
                               {"G", 1073741824.0}, {"T", 1099511627776.0}};
  const Unit* found = nullptr;
  for (const auto& u : units) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) {
    fail("size '" + std::string(text) + "' has unknown unit '" + unit +
         "' (use B, KiB, MiB, GiB or TiB)");
  }
  if (number.find('.') == std::string::npos) {
    // Integers are exact: no detour through double.
    unsigned long long n = 0;
    for (char c : number) {
      unsigned long long d = static_cast<unsigned long long>(c - '0');
      if (n > (std::numeric_limits<unsigned long long>::max() - d) / 10) {
        fail("size '" + std::string(text) + "' is too large");
      }
      n = n * 10 + d;
    }
    auto f = static_cast<unsigned long long>(found->factor);
    if (f != 0 && n > std::numeric_limits<size_t>::max() / f) {
      fail("size '" + std::string(text) + "' is too large");
    }
    return static_cast<size_t>(n * f);
  }
  double v = std::strtod(number.c_str(), nullptr) * found->factor;
  if (!(v >= 0) || v >= 18446744073709551615.0) fail("size '" + std::string(text) + "' is too large");
  return static_cast<size_t>(std::llround(v));
}

size_t parse_size_for(std::string_view key, std::string_view text) {
  try {
    return parse_size(text);
  } catch (const std::invalid_argument& e) {
    fail("EXPANSE_CONF: key '" + std::string(key) + "': " + e.what());
  }
}

long long parse_int_for(std::string_view key, std::string_view text, long long lo, long long hi) {
  std::string s(trim(text));
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end == nullptr || *end != '\0' || errno != 0 || v < lo || v > hi) {
    fail("EXPANSE_CONF: key '" + std::string(key) + "': '" + s + "' is not an integer in [" +
         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

bool parse_bool_for(std::string_view key, std::string_view text) {
  std::string s(trim(text));
  if (s == "true" || s == "1" || s == "on" || s == "yes") return true;
  if (s == "false" || s == "0" || s == "off" || s == "no") return false;
  fail("EXPANSE_CONF: key '" + std::string(key) + "': '" + s + "' is not true or false");
}

std::string format_size(size_t bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else if (v == std::floor(v)) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, names[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, names[u]);
  }
  return buf;
}

std::string from_environment() {
  const char* s = std::getenv("EXPANSE_CONF");
  return s == nullptr ? std::string() : std::string(s);
}

}  // namespace expanse::conf
