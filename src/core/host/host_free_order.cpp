#include "core/host/host_free_order.hpp"

#include "core/base/format.hpp"
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

void HostFreeOrder::add(uintptr_t at, size_t extent, CUstream stream,
                        const std::vector<CUstream>& recorded) {
  std::vector<CUstream> streams{stream};
  for (CUstream s : recorded) {
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  }
  Pending p;
  p.at = at;
  p.extent = extent;
  try {
    for (CUstream s : streams) {
      CUcontext ctx = nullptr;
      CUresult r = t_.stream_get_ctx(s, &ctx);
      if (r == CUDA_SUCCESS) {
        const CUevent e = event_for(ctx);
        p.events.emplace_back(ctx, e);
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

bool HostFreeOrder::completed(const Pending& p, bool wait) const {
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
