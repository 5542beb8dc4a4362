// The legacy (unversioned) symbols the real libcuda still exports, with their old ABI (spec §1.2):
// cuda.h redirects these names to the _v2 symbols, so this translation unit #undefs them and
// defines the old signatures (32-bit sizes for cuMemGetInfo/cuDeviceTotalMem, the 4-argument
// cuGetProcAddress of CUDA 11.3).
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include "sim/export/simcuda_internal.hpp"
#include "sim/sim_entry.hpp"

#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuGetProcAddress

#define EXPANSE_EXPORT extern "C" __attribute__((visibility("default")))

using expanse::sim::exported::ensure_configured;
namespace sim = expanse::sim;

EXPANSE_EXPORT CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes) {
  ensure_configured();
  return sim::sim_mem_get_info_v1(free_bytes, total_bytes);
}
EXPANSE_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  ensure_configured();
  return sim::sim_device_total_mem_v1(bytes, dev);
}
EXPANSE_EXPORT CUresult cuStreamDestroy(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_destroy(stream);
}
EXPANSE_EXPORT CUresult cuEventDestroy(CUevent event) {
  ensure_configured();
  return sim::sim_event_destroy(event);
}
EXPANSE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  ensure_configured();
  return sim::sim_device_primary_ctx_release(dev);
}
EXPANSE_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  ensure_configured();
  return sim::sim_ctx_push_current(ctx);
}
EXPANSE_EXPORT CUresult cuCtxPopCurrent(CUcontext* ctx) {
  ensure_configured();
  return sim::sim_ctx_pop_current(ctx);
}
EXPANSE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                         cuuint64_t flags) {
  ensure_configured();
  return sim::sim_get_proc_address_v1(symbol, pfn, cudaVersion, flags);
}
