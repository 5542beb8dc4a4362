// DeviceDriver's host staging and copies (sleep and wake of a pool): pinned host memory, async
// copies and memsets on a stream of the primary context, and the wait for them.
#include "core/device/device_driver.hpp"

namespace expanse::core {

using driver::EntryPoint;

void* DeviceDriver::host_alloc(size_t bytes) {
  ScopedContext scope(*this);
  if (!scope.ok()) check(CUDA_ERROR_INVALID_CONTEXT, EntryPoint::mem_host_alloc);
  count(EntryPoint::mem_host_alloc, bytes);
  void* p = nullptr;
  check(t_.mem_host_alloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE), EntryPoint::mem_host_alloc);
  return p;
}

void DeviceDriver::free_host(void* p) noexcept {
  if (p == nullptr) return;
  ScopedContext scope(*this);
  count(EntryPoint::mem_free_host, 0);
  (void)t_.mem_free_host(p);
}

CUstream DeviceDriver::create_copy_stream() {
  ScopedContext scope(*this);
  if (!scope.ok()) check(CUDA_ERROR_INVALID_CONTEXT, EntryPoint::stream_create);
  count(EntryPoint::stream_create, 0);
  CUstream s = nullptr;
  check(t_.stream_create(&s, CU_STREAM_NON_BLOCKING), EntryPoint::stream_create);
  return s;
}

void DeviceDriver::destroy_stream(CUstream s) noexcept {
  if (s == nullptr) return;
  ScopedContext scope(*this);
  count(EntryPoint::stream_destroy, 0);
  (void)t_.stream_destroy(s);
}

void DeviceDriver::copy_to_host(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::memcpy_dtoh_async, bytes);
  check(t_.memcpy_dtoh_async(dst, src, bytes, s), EntryPoint::memcpy_dtoh_async);
}

void DeviceDriver::copy_to_device(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::memcpy_htod_async, bytes);
  check(t_.memcpy_htod_async(dst, src, bytes, s), EntryPoint::memcpy_htod_async);
}

void DeviceDriver::zero(CUdeviceptr dst, size_t bytes, CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::memset_d8_async, bytes);
  check(t_.memset_d8_async(dst, 0, bytes, s), EntryPoint::memset_d8_async);
}

void DeviceDriver::stream_synchronize(CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::stream_synchronize, 0);
  check(t_.stream_synchronize(s), EntryPoint::stream_synchronize);
}

}  // namespace expanse::core
