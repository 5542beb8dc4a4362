#include "core/host/host_free_order.hpp"

#include "core/base/format.hpp"
#include "core/host/context_scope.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <string>

namespace expanse::core {

HostFreeOrder::~HostFreeOrder() {
  for (const Pending& p : pending_) {
    for (const auto& [ctx, e] : p.events) t_.event_destroy(e);
  }
  for (const auto& [ctx, events] : idle_) {
    for (CUevent e : events) t_.event_destroy(e);
  }
}

CUevent HostFreeOrder::event_for(CUcontext ctx) {
  auto& idle = idle_[ctx];
  if (!idle.empty()) {
    const CUevent e = idle.back();
    idle.pop_back();
    return e;
  }
  CUevent e = nullptr;
  CUresult r = t_.ctx_push_current(ctx);
  if (r == CUDA_SUCCESS) {
    r = t_.event_create(&e, CU_EVENT_DISABLE_TIMING);
    CUcontext popped = nullptr;
    t_.ctx_pop_current(&popped);
  }
  if (r != CUDA_SUCCESS) {
    throw driver_failure("expanse: host free: cuEventCreate failed (" + code_name(r) +
                             "); nothing was changed",
                         static_cast<int>(r));
  }
  return e;
}

void HostFreeOrder::add(uintptr_t at, size_t extent, const std::vector<NamedStream>& named) {
  std::vector<NamedStream> streams;
  for (const NamedStream& n : named) {
    if (std::find(streams.begin(), streams.end(), n) == streams.end()) streams.push_back(n);
  }
  Pending p;
  p.at = at;
  p.extent = extent;
  try {
    for (const NamedStream& n : streams) {
      const CUstream s = n.stream;
      // A NULL, legacy or per-thread handle is the stream of the context it was named in.
      const bool special = s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
      ContextScope in(t_, special ? n.ctx : nullptr);
      CUcontext ctx = nullptr;
      CUresult r = t_.stream_get_ctx(s, &ctx);
      if (r == CUDA_SUCCESS) {
        const CUevent e = event_for(ctx);
        p.events.emplace_back(ctx, e);
        ContextScope own(t_, special ? nullptr : ctx);  // the freeing thread may have none
        r = t_.event_record(e, s);
      }
      if (r != CUDA_SUCCESS) {
        throw driver_failure("expanse: host free of " + hex(at) + ": an event on stream " +
                                 hex(reinterpret_cast<uintptr_t>(s)) + " failed (" +
                                 code_name(r) + "); nothing was changed (the block is live)",
                             static_cast<int>(r));
      }
    }
    pending_.push_back(std::move(p));
  } catch (...) {
    for (const auto& [ctx, e] : p.events) idle_[ctx].push_back(e);
    throw;
  }
}

void BlockUsers::name(const driver::DriverTable& t, CUstream stream) {
  if (stream == CU_STREAM_PER_THREAD) {
    per_thread = true;
    return;
  }
  const bool special = stream == nullptr || stream == CU_STREAM_LEGACY;
  const NamedStream n{stream, special ? current_or(t, ctx) : nullptr};
  if (std::find(streams.begin(), streams.end(), n) == streams.end()) streams.push_back(n);
}

void HostFreeOrder::add_free(uintptr_t at, size_t extent, const BlockUsers& users,
                             std::vector<NamedStream> freeing, CUcontext after,
                             bool every_stream) {
  if (every_stream || users.per_thread) {
    add_after_context(at, extent, after == nullptr ? users.ctx : after);
    return;
  }
  freeing.insert(freeing.end(), users.streams.begin(), users.streams.end());
  if (freeing.empty()) {
    add_after_context(at, extent, after == nullptr ? users.ctx : after);
  } else {
    add(at, extent, freeing);
  }
}

void HostFreeOrder::add_after_context(uintptr_t at, size_t extent, CUcontext ctx) {
  Pending p;
  p.at = at;
  p.extent = extent;
  p.after_ctx = ctx;
  p.syncs = syncs_[ctx];
  pending_.push_back(std::move(p));
  context_pending_bytes_ += extent;
}

size_t HostFreeOrder::sync_contexts() {
  std::vector<CUcontext> owed;
  for (const Pending& p : pending_) {
    if (p.after_ctx != nullptr && syncs_[p.after_ctx] == p.syncs &&
        std::find(owed.begin(), owed.end(), p.after_ctx) == owed.end()) {
      owed.push_back(p.after_ctx);
    }
  }
  size_t n = 0;
  for (CUcontext ctx : owed) {
    const CUresult pushed = t_.ctx_push_current(ctx);
    if (pushed == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
      ++syncs_[ctx];  // a destroyed context runs nothing more: its blocks are free
      idle_.erase(ctx);  // and its events are gone with it (a new context may reuse the handle)
      ++n;
      continue;
    }
    if (pushed != CUDA_SUCCESS) continue;
    // A blocking stream of ctx capturing (the legacy stream answers IMPLICIT then) would be
    // invalidated by the synchronize: its blocks wait for a later one. (A capture the
    // application announced stops every poll before this: HostMemory::may_poll.)
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    const CUresult q = t_.stream_is_capturing(CU_STREAM_LEGACY, &capturing);
    const CUresult r = q == CUDA_SUCCESS && capturing == CU_STREAM_CAPTURE_STATUS_NONE
                           ? t_.ctx_synchronize()
                           : CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    CUcontext popped = nullptr;
    t_.ctx_pop_current(&popped);
    if (r != CUDA_SUCCESS) continue;
    ++syncs_[ctx];
    ++n;
  }
  return n;
}

bool HostFreeOrder::completed(const Pending& p, bool wait) const {
  if (p.after_ctx != nullptr) {
    auto it = syncs_.find(p.after_ctx);
    return it != syncs_.end() && it->second > p.syncs;
  }
  for (const auto& [ctx, e] : p.events) {
    if ((wait ? t_.event_synchronize(e) : t_.event_query(e)) != CUDA_SUCCESS) return false;
  }
  return true;
}

bool HostFreeOrder::is_pending(uintptr_t at) const {
  for (const Pending& p : pending_) {
    if (p.at == at) return true;
  }
  return false;
}

}  // namespace expanse::core
