// The driver a benchmark runs on: the one EXPANSE_BENCH_CONF names (driver:cuda: a real GPU), or
// else a sim device of `sim_capacity` bytes. One place for the choice, so every benchmark reads
// the same variable the same way.
#pragma once

#include "driver/driver.hpp"

#include <cstdlib>
#include <memory>

namespace expanse::bench {

// The EXPANSE_BENCH_CONF text when set (a real driver is asked for), else nullptr.
inline const char* real_driver_conf() {
  const char* conf = std::getenv("EXPANSE_BENCH_CONF");
  return conf != nullptr && *conf != '\0' ? conf : nullptr;
}

// sim_backing: whether the sim keeps host memory behind pages (needed only where bytes are
// copied; hot paths never reach the driver).
inline std::unique_ptr<driver::LoadedDriver> open_bench_driver(size_t sim_capacity,
                                                               bool sim_backing,
                                                               const char* sim_name) {
  if (const char* conf = real_driver_conf()) {
    return driver::select_driver(conf, /*allow_sim_fallback=*/false);
  }
  driver::SimConfig cfg;
  cfg.capacity = sim_capacity;
  cfg.backing = sim_backing;
  return driver::load_sim(cfg, sim_name);
}

}  // namespace expanse::bench
