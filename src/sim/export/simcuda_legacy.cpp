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
#undef cuStreamBeginCapture
#undef cuStreamGetCaptureInfo

// Old-ABI capture variants that cuda.h 13 no longer declares.
extern "C" {
CUresult cuStreamBeginCapture(CUstream stream);
CUresult cuStreamBeginCapture_ptsz(CUstream stream);
CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id);
CUresult cuStreamGetCaptureInfo_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                     cuuint64_t* id);
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** deps, size_t* num_deps);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** deps, size_t* num_deps);
}

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
// The CUDA 11.3 ABI: no status argument; a missing symbol or variant is CUDA_ERROR_NOT_FOUND.
EXPANSE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                         cuuint64_t flags) {
  ensure_configured();
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult r = expanse::sim::exported::proc_address(symbol, pfn, cudaVersion, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPANSE_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_begin_capture_v1(stream);
}
EXPANSE_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_begin_capture_v1_ptsz(stream);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status,
                                               cuuint64_t* id) {
  ensure_configured();
  return sim::sim_stream_get_capture_info_v1(stream, status, id);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream stream,
                                                    CUstreamCaptureStatus* status,
                                                    cuuint64_t* id) {
  ensure_configured();
  return sim::sim_stream_get_capture_info_v1_ptsz(stream, status, id);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status,
                                                  cuuint64_t* id, CUgraph* graph,
                                                  const CUgraphNode** deps, size_t* num_deps) {
  ensure_configured();
  return sim::sim_stream_get_capture_info_v2(stream, status, id, graph, deps, num_deps);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream,
                                                       CUstreamCaptureStatus* status,
                                                       cuuint64_t* id, CUgraph* graph,
                                                       const CUgraphNode** deps,
                                                       size_t* num_deps) {
  ensure_configured();
  return sim::sim_stream_get_capture_info_v2_ptsz(stream, status, id, graph, deps, num_deps);
}

namespace expanse::sim::exported {

const Export* legacy_exports(size_t* n) noexcept {
  static const Export table[] = {
      {"cuMemGetInfo", reinterpret_cast<void*>(&cuMemGetInfo)},
      {"cuDeviceTotalMem", reinterpret_cast<void*>(&cuDeviceTotalMem)},
      {"cuStreamDestroy", reinterpret_cast<void*>(&cuStreamDestroy)},
      {"cuEventDestroy", reinterpret_cast<void*>(&cuEventDestroy)},
      {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease)},
      {"cuCtxPushCurrent", reinterpret_cast<void*>(&cuCtxPushCurrent)},
      {"cuCtxPopCurrent", reinterpret_cast<void*>(&cuCtxPopCurrent)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
      {"cuStreamBeginCapture", reinterpret_cast<void*>(&cuStreamBeginCapture)},
      {"cuStreamBeginCapture_ptsz", reinterpret_cast<void*>(&cuStreamBeginCapture_ptsz)},
      {"cuStreamGetCaptureInfo", reinterpret_cast<void*>(&cuStreamGetCaptureInfo)},
      {"cuStreamGetCaptureInfo_ptsz", reinterpret_cast<void*>(&cuStreamGetCaptureInfo_ptsz)},
      {"cuStreamGetCaptureInfo_v2", reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v2)},
      {"cuStreamGetCaptureInfo_v2_ptsz",
       reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v2_ptsz)},
  };
  *n = sizeof table / sizeof table[0];
  return table;
}

}  // namespace expanse::sim::exported
