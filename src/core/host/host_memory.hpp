// Pinned host memory of one host NUMA node, as the C ABI sees it (expanse_host_*): the HOST_NUMA
// pool (host_pool.hpp), or where the driver cannot make host memory through the VMM API the
// registered fallback (host_registered.hpp), which says which promises it drops.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace expanse::core {

enum class HostPath : int {
  vmm = 1,         // HOST_NUMA pages, exact, moved between blocks
  registered = 2,  // mmap + cuMemHostRegister per block: exact, but pinned anew for every block
};

struct HostPoolStats {
  uint64_t requested_bytes = 0;     // live blocks, as asked
  uint64_t allocated_bytes = 0;     // live blocks, as placed (rounded)
  uint64_t pinned_bytes = 0;        // pages held: mapped and pooled (registered: live and pending)
  uint64_t mapped_bytes = 0;
  uint64_t peak_pinned_bytes = 0;
  uint64_t limit_bytes = 0;         // UINT64_MAX: none
  uint64_t live_blocks = 0;
  uint64_t pending_blocks = 0;      // freed, waiting for their streams' events
  uint64_t num_allocs = 0;
  uint64_t num_frees = 0;
  uint64_t num_created_pages = 0;   // cuMemCreate (registered: cuMemHostRegister calls)
  uint64_t num_released_pages = 0;  // cuMemRelease (registered: cuMemHostUnregister calls)
  uint64_t num_remapped_pages = 0;  // unmapped under free memory and mapped again elsewhere
  uint64_t num_waits = 0;           // requests that waited for freed blocks' events
  uint64_t num_ooms = 0;
  uint64_t page_bytes = 0;
  HostPath path = HostPath::vmm;
};

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // A block of `size` bytes; device: the ordinal to grant access to, or -1. Throws
  // out_of_memory, usage_error (size 0), driver_failure; nothing changes on a throw.
  virtual void* allocate(size_t size, CUstream stream, int device) = 0;
  // Frees a live block once the work on stream (and record_stream's streams) is done.
  virtual void free(void* p, CUstream stream) = 0;
  // Frees a live block that its user cannot name a stream for (a tensor's deleter): reused once
  // the streams record_stream named are done, or where none was named, once every stream of ctx
  // (nullptr: the context current when the block was allocated, else the pool's) has passed
  // this call. A request that would pin new memory while at least its size waits so
  // synchronizes those contexts first, which proves it (pinned memory then stays near the live
  // blocks instead of growing by every such free).
  // every_stream: the named streams are ignored (a CUDA graph's block, which replays on any
  // stream may read).
  virtual void free_after_context(void* p, CUcontext ctx, bool every_stream) = 0;
  virtual void record_stream(void* p, CUstream stream) = 0;
  virtual void release_cached() = 0;
  virtual void set_limit(size_t bytes) = 0;
  virtual HostPoolStats stats() const = 0;
  // The peak pinned bytes start again from the pinned bytes now.
  virtual void reset_peak() = 0;
  // Whether p lies in memory this node's host memory handed out (live, pending or cached).
  virtual bool contains(const void* p) const = 0;
  // The live block holding p (its start and requested size); false where p is in none.
  virtual bool block_of(const void* p, void** base, size_t* size) const = 0;
  virtual HostPath path() const = 0;
  // Whether the freed blocks' events may be queried or waited for now: not while the
  // application captures a CUDA graph (a query or wait then invalidates a global-mode capture).
  // Unset: always. A request that may not poll uses only memory proven free already.
  void set_may_poll(std::function<bool()> may_poll) { may_poll_ = std::move(may_poll); }

 protected:
  bool may_poll() const { return !may_poll_ || may_poll_(); }

 private:
  std::function<bool()> may_poll_;
};

}  // namespace expanse::core
