// The library's reading of EXPANSE_CONF: driver choice plus allocator options.
#pragma once

#include "core/options.hpp"

#include <string>

namespace expanse::api {

struct Config {
  std::string text;  // the EXPANSE_CONF string itself (the driver loader reads driver/sim keys)
  core::AllocatorOptions allocator;
  double limit_fraction = 0;  // limit:0.8 → 80% of each device's capacity (0: not a fraction)
};

// Parses and validates every key; throws expanse::usage_error naming a bad key or value.
Config parse_config(const std::string& text);

// Options for one device once its capacity is known (resolves a fractional limit).
core::AllocatorOptions options_for_device(const Config& c, size_t capacity);

}  // namespace expanse::api
