// The fallback where the driver cannot make host memory through the VMM API (attribute 141 is 0,
// or a container without the capability): each block is its own mmap, pinned with
// cuMemHostRegister at its exact size (to the host page) and unpinned and unmapped once its
// streams' work is done. What it drops, and stats and `expanse info` say so: pages are not
// reused between blocks (every block pins anew, as cuMemHostAlloc does), nor placed on the node
// (the kernel's first touch places them). Not thread-safe: the caller locks.
#pragma once

#include "core/host/host_free_order.hpp"
#include "core/host/host_memory.hpp"
#include "driver_api/driver_table.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace expanse::core {

class RegisteredHost final : public HostMemory {
 public:
  RegisteredHost(const driver::DriverTable& t, int node, CUcontext ctx, size_t limit);
  ~RegisteredHost() override;  // unpins and unmaps every block (live ones included: shutdown)
  RegisteredHost(const RegisteredHost&) = delete;
  RegisteredHost& operator=(const RegisteredHost&) = delete;

  void* allocate(size_t size, CUstream stream, int device) override;
  void free(void* p, CUstream stream) override;
  void free_after_context(void* p, CUcontext ctx, bool every_stream) override;
  void record_stream(void* p, CUstream stream) override;
  void release_cached() override;
  void set_limit(size_t bytes) override { limit_ = bytes; }
  void reset_peak() override;
  HostPoolStats stats() const override;
  bool block_of(const void* p, void** base, size_t* size) const override;
  bool contains(const void* p) const override;
  HostPath path() const override { return HostPath::registered; }

 private:
  struct Block {
    size_t size = 0;
    size_t extent = 0;
    BlockUsers users;  // record_stream's streams, and the context it was allocated in
  };
  void give_back(uintptr_t at, size_t extent) noexcept;
  // Frees the live block at p: its books, and its place in the free order
  // (HostFreeOrder::add_free, which says what the free waits for).
  void retire(void* p, std::vector<NamedStream> streams, CUcontext after, bool every_stream);
  std::string describe(uintptr_t a) const;

  const driver::DriverTable& t_;
  int node_;
  CUcontext ctx_;
  size_t limit_;
  size_t page_;
  std::map<uintptr_t, Block> blocks_;
  std::map<uintptr_t, size_t> pending_extent_;  // freed blocks not yet unpinned
  HostFreeOrder order_;
  size_t pinned_ = 0;
  HostPoolStats stats_;
};

}  // namespace expanse::core
