// Per-device allocator tuning (the option set itself lives in conf/allocator_options.hpp, where
// EXPANSE_CONF is parsed) and the allocator's fixed carving granularity.
#pragma once

#include "conf/allocator_options.hpp"

#include <cstddef>

namespace expanse::core {

inline constexpr size_t kBlockAlignment = 512;  // every block is carved at this granularity
inline constexpr size_t kNoLimit = conf::kNoLimit;
using AllocatorOptions = conf::AllocatorOptions;

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace expanse::core
