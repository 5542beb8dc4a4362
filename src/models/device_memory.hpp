// The physical memory of the modelled device: what the models' cudaMalloc / cuMemCreate draw
// from, up to a capacity (nothing else on the device holds memory).
#pragma once

#include <cstdint>

namespace expanse::replay {

struct DeviceMemory {
  uint64_t capacity = 0;
  uint64_t used = 0;

  bool take(uint64_t bytes) noexcept {
    if (bytes > capacity || used > capacity - bytes) return false;
    used += bytes;
    return true;
  }
  void give(uint64_t bytes) noexcept { used -= bytes; }
  uint64_t free() const noexcept { return capacity - used; }
};

}  // namespace expanse::replay
