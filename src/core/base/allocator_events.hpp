// An observer of one device allocator, for memory history (PyTorch-style snapshots, api/history).
//
// The allocator calls it with its lock held, at the one place each thing happens: a block handed
// out or freed, physical pages mapped into or unmapped from VA, a request that failed for lack of
// memory. Calls are therefore in the allocator's own order. An observer must be quick, must not
// call back into the allocator and must not throw (it is noexcept here; history drops what it
// cannot record).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

class AllocatorEvents {
 public:
  virtual ~AllocatorEvents() = default;
  // A block of `requested` bytes at addr became live, allocated on stream.
  virtual void on_alloc(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept = 0;
  // The live block at addr (of `requested` bytes) was freed on stream.
  virtual void on_free(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept = 0;
  // [addr, addr + bytes) was mapped to physical memory / unmapped from it.
  virtual void on_map(int device, CUdeviceptr addr, size_t bytes) noexcept = 0;
  virtual void on_unmap(int device, CUdeviceptr addr, size_t bytes) noexcept = 0;
  // A request of `requested` bytes on stream failed for lack of memory; `free_bytes` is what the
  // device could still give (capacity or limit minus pages touched by live blocks).
  virtual void on_oom(int device, size_t requested, CUstream stream, size_t free_bytes) noexcept = 0;
};

// What DeviceAllocator::segments() reports: each maximal run of mapped pages, and the blocks
// (clipped to the run) that lie in it, in address order, tiling it.
struct BlockView {
  enum class State : uint8_t { live, awaiting_free, free };
  CUdeviceptr address = 0;
  size_t size = 0;       // bytes of the block inside the segment
  size_t requested = 0;  // live: bytes asked for; else 0
  State state = State::free;
};

struct SegmentView {
  CUdeviceptr address = 0;
  size_t size = 0;
  bool small_arena = false;
  std::vector<BlockView> blocks;
};

}  // namespace expanse::core
