// The library's reading of EXPANSE_CONF: the allocator options, checked together with every other
// key (driver choice, sim_*), so that a bad string fails where it is read.
#pragma once

#include "conf/allocator_options.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace expanse::conf {

struct Config {
  std::string text;  // the EXPANSE_CONF string itself (the driver loader reads driver/sim keys)
  AllocatorOptions allocator;
  double limit_fraction = 0;  // limit:0.8 → 80% of each device's capacity (0: not a fraction)
  double reserve_fraction = 0;  // reserve:0.9 → 90% of each device's capacity (0: not a fraction)
  size_t host_limit = SIZE_MAX;  // host_limit: most bytes of pinned host pages per NUMA node
};

// Parses and validates every key; throws expanse::usage_error naming a bad key or value.
Config parse_config(const std::string& text);

// A reservation as EXPANSE_CONF or expanse_reserve spells it: "free", a fraction in (0, 1] ("0.9")
// or a size ("40GiB", "0" for none). Throws usage_error naming `what` and the text otherwise.
struct ReserveSpec {
  bool free = false;
  double fraction = 0;
  size_t bytes = 0;
};
ReserveSpec parse_reserve(const std::string& what, const std::string& text);

// Options for one device once its capacity is known (resolves a fractional limit and reserve).
AllocatorOptions options_for_device(const Config& c, size_t capacity);

}  // namespace expanse::conf
