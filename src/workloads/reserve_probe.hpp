// What EXPANSE_CONF reserve would hold on a device now (`expanse info`): the reservation made
// for real in this process, read back and given back.
#pragma once

#include "conf/config.hpp"
#include "driver/driver.hpp"

#include <cstddef>
#include <string>

namespace expanse::replay {

struct ReserveProbe {
  std::string spec;         // as configured: "free less 512 MiB", "90% of the capacity", a size
  size_t asked_bytes = 0;   // what it asked (free: what the driver said was free, less the margin)
  size_t held_bytes = 0;    // what it got (below asked_bytes: kept partial)
  std::string error;        // why it could not be had ("" when held)
};

// Nothing configured: spec is "".
ReserveProbe probe_reservation(const driver::LoadedDriver& drv, int device,
                               const conf::Config& conf, size_t capacity);

}  // namespace expanse::replay
