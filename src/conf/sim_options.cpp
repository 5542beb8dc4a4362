#include "conf/sim_options.hpp"

#include "conf/env_config.hpp"

#include <stdexcept>

#include <unistd.h>

namespace expanse::conf {
namespace {

bool is_power_of_two(size_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

size_t host_page_size() noexcept {
  static const size_t page = [] {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

}  // namespace

SimOptions parse_sim_options(const std::string& conf) {
  SimOptions cfg;
  bool capacity_given = false;
  for (const auto& [key, value] : parse_pairs(conf)) {
    if (key == "sim_devices") {
      cfg.devices = static_cast<int>(parse_int_for(key, value, 0, kMaxSimDevices));
    } else if (key == "sim_capacity") {
      cfg.capacity = parse_size_for(key, value);
      if (cfg.capacity == 0) {
        throw std::invalid_argument("EXPANSE_CONF: key 'sim_capacity': '" + value +
                                    "' must be more than 0");
      }
      capacity_given = true;
    } else if (key == "sim_granularity") {
      cfg.granularity = parse_size_for(key, value);
      if (!is_power_of_two(cfg.granularity) || cfg.granularity < 4096 ||
          cfg.granularity < host_page_size()) {
        throw std::invalid_argument("EXPANSE_CONF: key 'sim_granularity': '" + value +
                                    "' is not a power of two of at least 4096 bytes (and the "
                                    "host page size)");
      }
    } else if (key == "sim_backing") {
      cfg.backing = parse_bool_for(key, value);
    } else if (key == "sim_driver_version") {
      // CUDA 10.2 (VMM's first release) .. 99.9, as 1000 * major + 10 * minor.
      cfg.driver_version = static_cast<int>(parse_int_for(key, value, 10020, 99990));
    } else if (key == "sim_peer_access") {
      cfg.peer_access = parse_bool_for(key, value);
    } else if (key == "sim_posix_fd") {
      cfg.posix_fd = parse_bool_for(key, value);
    } else if (key == "sim_host_capacity") {
      cfg.host_capacity = parse_size_for(key, value);
    } else if (key == "sim_host_numa") {
      cfg.host_numa = parse_bool_for(key, value);
    } else if (key == "sim_numa_nodes") {
      cfg.numa_nodes = static_cast<int>(parse_int_for(key, value, 1, 64));
    } else if (key == "sim_gpu_lag") {
      cfg.gpu_lag = static_cast<uint64_t>(parse_int_for(key, value, 0, 1LL << 40));
    } else if (key == "sim_rdma") {
      cfg.rdma_wsl = value == "wsl";
      cfg.rdma = cfg.rdma_wsl || parse_bool_for(key, value);
    }
  }
  if (cfg.capacity % cfg.granularity != 0) {
    throw std::invalid_argument(
        std::string("EXPANSE_CONF: key 'sim_capacity': ") + format_size(cfg.capacity) +
        (capacity_given ? "" : " (the default)") + " is not a multiple of sim_granularity " +
        format_size(cfg.granularity));
  }
  return cfg;
}

}  // namespace expanse::conf
