// CUDA events for stream-order fences, reused per context (an event is recorded with its own
// context current). Every event made is destroyed with the pool's owner (destroy_all).
#pragma once

#include "core/device/device_driver.hpp"

#include <cuda.h>

#include <unordered_map>
#include <utility>
#include <vector>

namespace expanse::core {

class EventPool {
 public:
  explicit EventPool(DeviceDriver& drv) : drv_(drv) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An unused event of ctx (made when none is pooled); nullptr when the context cannot make one.
  CUevent get(CUcontext ctx);
  // e (got from ctx) is unused again: it completed, or was never recorded.
  void put(CUcontext ctx, CUevent e) { free_[ctx].push_back(e); }
  // Destroys every event made (at shutdown).
  void destroy_all();
  size_t made() const noexcept { return all_.size(); }

 private:
  DeviceDriver& drv_;
  std::unordered_map<CUcontext, std::vector<CUevent>> free_;
  std::vector<std::pair<CUcontext, CUevent>> all_;
};

}  // namespace expanse::core
