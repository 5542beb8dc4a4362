#include "core/streams/event_pool.hpp"

namespace expanse::core {

CUevent EventPool::get(CUcontext ctx) {
  auto& pool = free_[ctx];
  if (!pool.empty()) {
    CUevent e = pool.back();
    pool.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (drv_.event_create(ctx, &e) != CUDA_SUCCESS) return nullptr;
  all_.emplace_back(ctx, e);
  return e;
}

void EventPool::destroy_all() {
  for (auto [ctx, e] : all_) drv_.event_destroy(ctx, e);
  all_.clear();
  free_.clear();
}

}  // namespace expanse::core
