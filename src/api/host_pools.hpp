// The process's pinned host memory (expanse_host_*): per host NUMA node, created on first use in
// the context of the device that first asked, a core::HostPool where a probe (attribute 141, and
// one page created and released) says the driver can make host memory through the VMM API, else
// the core::RegisteredHost fallback, which the stats' path names.
#pragma once

#include "core/host/host_memory.hpp"
#include "core/host/host_staging.hpp"

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>

namespace expanse::api {

class Runtime;

// Also every device allocator's host staging: a sleeping pool's bytes go to these pools.
class HostPools final : public core::HostStaging {
 public:
  HostPools(Runtime& rt, size_t limit) : rt_(rt), limit_(limit) {}
  // node -1: the nearest node of the device of stream (or of the current context, or device 0).
  void* allocate(size_t size, int node, CUstream stream);
  void free(void* p, CUstream stream);
  void record_stream(void* p, CUstream stream);
  // Frees p once the streams record_stream named are done, or where none was named, once every
  // stream of `device` (-1: the block's own, the context current when it was allocated) has
  // passed this call (core::HostMemory::free_after_context).
  // every_stream: the named streams are ignored, every stream of the device is waited for.
  void free_after_device(void* p, int device, bool every_stream);
  // Refuses, naming `what` and p, a device that is neither -1 (the block's own) nor one of this
  // process's.
  void check_device(int device, const void* p, const char* what) const;
  void release_cached();
  void set_limit(size_t bytes);
  void reset_peak();
  // node -1: every pool's figures summed (page_bytes: the first's). Sleep staging counts in the
  // pinned bytes, not in the live blocks or the requested bytes.
  core::HostPoolStats stats(int node);
  // The requested size of the live block allocate() returned at p (staging excluded); throws
  // usage_error naming what p is otherwise. what: the caller's name, for the message.
  size_t live_size(const void* p, const char* what);
  // The live block allocate() returned that holds p (staging excluded): its start and requested
  // size; false where p is in none. Takes no exception path: a tensor library asks it of every
  // pointer it copies from.
  bool block_of(const void* p, void** base, size_t* size);
  // Live blocks handed out by allocate() (staging excluded).
  bool any_live() const;
  void* stage(size_t bytes, int device) noexcept override;
  bool unstage(void* p) noexcept override;

 private:
  // named: the caller chose the node (a refused node is then its error, not a reason to fall
  // back).
  core::HostMemory& pool_locked(int node, int device, bool named);
  core::HostMemory* owner_locked(const void* p);
  // The refusal for a pointer no pool holds (called without mu_: it asks the devices).
  [[noreturn]] void refuse(const void* p, const char* what) const;
  void check_not_staged_locked(const void* p, const char* what) const;
  bool probe_vmm(int node, int device, bool named) const;
  int device_of(CUstream stream) const;

  Runtime& rt_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<core::HostMemory>> pools_;
  size_t limit_;
  // Blocks stage() handed out and unstage() has not taken back: their node and bytes (the stats
  // count them as pinned, not as the application's live blocks).
  std::map<void*, std::pair<int, size_t>> staged_;
};

}  // namespace expanse::api
