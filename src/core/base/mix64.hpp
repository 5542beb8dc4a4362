// The 64-bit finalizer that names a workload's points and shapes (placement_echo.hpp,
// workload_shape.hpp): every input bit moves every output bit, so names of nearby histories
// spread over a table.
#pragma once

#include <cstdint>

namespace expanse::core {

constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace expanse::core
