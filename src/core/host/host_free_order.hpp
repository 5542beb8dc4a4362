// When freed host memory may be used again: a block freed with a stream (and the streams
// record_stream named) is pending until an event recorded on each at the free has completed, as
// PyTorch's host allocator orders it. A block freed after a device (a tensor's deleter, which
// knows no stream) is pending until every stream of the device's context has passed the free:
// no event can say that, so a synchronize of the context after the free proves it. Shared by the
// HOST_NUMA pool and the registered fallback. Not thread-safe: the owner locks.
#pragma once

#include "driver_api/driver_table.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace expanse::core {

// A stream a block's user named, with the context it was named in: a NULL, legacy or per-thread
// handle means that context's stream, whichever thread frees the block later.
struct NamedStream {
  CUstream stream = nullptr;
  CUcontext ctx = nullptr;
  bool operator==(const NamedStream& o) const { return stream == o.stream && ctx == o.ctx; }
};

// Who used a live block, as its free must know: the streams record_stream named, whether one was
// a per-thread stream (no later free on another thread can reach it), and the context current
// when the block was allocated. Kept by each pool's block.
struct BlockUsers {
  std::vector<NamedStream> streams;
  bool per_thread = false;
  CUcontext ctx = nullptr;
  // record_stream: a NULL or legacy handle names the stream of the calling thread's current
  // context (ctx where it has none), whichever thread frees the block later.
  void name(const driver::DriverTable& t, CUstream stream);
};

class HostFreeOrder {
 public:
  explicit HostFreeOrder(const driver::DriverTable& t) : t_(t) {}
  ~HostFreeOrder();
  HostFreeOrder(const HostFreeOrder&) = delete;
  HostFreeOrder& operator=(const HostFreeOrder&) = delete;

  // Records an event (in its context) on each of `streams` (the free's and record_stream's) for
  // the block at `at` of `extent` bytes. Throws driver_failure naming the call, with nothing
  // pending then.
  void add(uintptr_t at, size_t extent, const std::vector<NamedStream>& streams);
  // The block at `at` is pending until a synchronize of ctx made after this call (by
  // sync_contexts) has completed.
  void add_after_context(uintptr_t at, size_t extent, CUcontext ctx);
  // The free of the block at `at` that `users` used: pending on the events of `freeing` and of
  // the streams users named, or where there are none (every_stream, or a per-thread stream
  // named), on a synchronize of `after` (nullptr: users.ctx) made later. Throws as add does.
  void add_free(uintptr_t at, size_t extent, const BlockUsers& users,
                std::vector<NamedStream> freeing, CUcontext after, bool every_stream);
  // Bytes freed after a context and not proven yet: what a synchronize would give back.
  size_t context_pending_bytes() const noexcept { return context_pending_bytes_; }
  // Synchronizes each context a pending block waits for (made current around the call); a
  // context the driver fails to synchronize keeps its blocks pending. Returns how many
  // synchronized.
  size_t sync_contexts();
  // Hands each pending block whose events have all completed to done(at, extent) and forgets it;
  // wait: synchronizes with the events first. An event the driver answers with an error stays
  // pending (never proven done, never reused). Returns how many were handed.
  template <class Done>
  size_t poll(bool wait, Done&& done) {
    if (wait && context_pending_bytes_ != 0) sync_contexts();
    size_t n = 0;
    for (size_t k = 0; k < pending_.size();) {
      if (!completed(pending_[k], wait)) {
        ++k;
        continue;
      }
      const Pending p = std::move(pending_[k]);
      pending_[k] = std::move(pending_.back());
      pending_.pop_back();
      for (const auto& [ctx, e] : p.events) idle_[ctx].push_back(e);
      if (p.after_ctx != nullptr) context_pending_bytes_ -= p.extent;
      done(p.at, p.extent);
      ++n;
    }
    return n;
  }
  size_t pending() const noexcept { return pending_.size(); }
  bool is_pending(uintptr_t at) const;

 private:
  struct Pending {
    uintptr_t at = 0;
    size_t extent = 0;
    std::vector<std::pair<CUcontext, CUevent>> events;
    CUcontext after_ctx = nullptr;  // add_after_context's: pending until syncs_[after_ctx] > syncs
    uint64_t syncs = 0;
  };
  bool completed(const Pending& p, bool wait) const;
  CUevent event_for(CUcontext ctx);

  const driver::DriverTable& t_;
  std::vector<Pending> pending_;
  std::map<CUcontext, std::vector<CUevent>> idle_;
  std::map<CUcontext, uint64_t> syncs_;  // synchronizes completed, per context
  size_t context_pending_bytes_ = 0;
};

}  // namespace expanse::core
