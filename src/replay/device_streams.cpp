#include "replay/device_streams.hpp"

namespace expanse::replay {

using driver::EntryPoint;

DeviceStreams::DeviceStreams(const driver::LoadedDriver& drv, int device,
                             const std::vector<uint64_t>& ids)
    : drv_(drv) {
  const auto& t = drv_.table();
  drv_.check(t.device_get(&dev_, device), EntryPoint::device_get);
  drv_.check(t.device_primary_ctx_retain(&ctx_, dev_), EntryPoint::device_primary_ctx_retain);
  try {
    push();
    streams_.reserve(ids.size());
    for (uint64_t id : ids) {
      CUstream s = nullptr;
      if (id != 0) {
        CUresult r = t.stream_create(&s, CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
          pop();
          drv_.check(r, EntryPoint::stream_create, "creating a stream for the workload");
        }
        created_.push_back(s);
      }
      streams_.push_back(s);
    }
    pop();
  } catch (...) {
    push();
    for (CUstream s : created_) t.stream_destroy(s);
    pop();
    t.device_primary_ctx_release(dev_);
    throw;
  }
}

DeviceStreams::~DeviceStreams() {
  const auto& t = drv_.table();
  if (t.ctx_push_current(ctx_) == CUDA_SUCCESS) {
    for (CUstream s : created_) t.stream_destroy(s);
    pop();
  }
  t.device_primary_ctx_release(dev_);
}

void DeviceStreams::to_device(void* dst, const void* src, size_t bytes) const {
  drv_.check(drv_.table().memcpy_htod(reinterpret_cast<CUdeviceptr>(dst), src, bytes),
             EntryPoint::memcpy_htod);
}

void DeviceStreams::to_host(void* dst, const void* src, size_t bytes) const {
  drv_.check(drv_.table().memcpy_dtoh(dst, reinterpret_cast<CUdeviceptr>(src), bytes),
             EntryPoint::memcpy_dtoh);
}

void DeviceStreams::push() const {
  drv_.check(drv_.table().ctx_push_current(ctx_), EntryPoint::ctx_push_current);
}

void DeviceStreams::pop() const {
  CUcontext popped = nullptr;
  drv_.table().ctx_pop_current(&popped);
}

}  // namespace expanse::replay
