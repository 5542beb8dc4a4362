// Where a DeviceAllocator stages a sleeping pool's bytes: the process's pinned host memory (the
// runtime's host pools, api/host_pools.hpp), so that a sleep's exact-size staging shares their
// pages and a later sleep or an offload reuses them without pinning anew. Without one, or when
// it has none to give, the allocator pins its own (cuMemHostAlloc).
#pragma once

#include <cstddef>

namespace expanse::core {

class HostStaging {
 public:
  virtual ~HostStaging() = default;
  // `bytes` of pinned host memory near `device`, or nullptr when none can be had.
  virtual void* stage(size_t bytes, int device) noexcept = 0;
  // Gives back what stage() returned (used again once the device's work is done); false for a
  // pointer it did not hand out.
  virtual bool unstage(void* p) noexcept = 0;
};

}  // namespace expanse::core
