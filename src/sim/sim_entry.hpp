// The sim's driver entry points as plain functions: what table() points at, what cuGetProcAddress
// answers with, and what libexpanse_simcuda.so exports under the real symbol names.
//
// Each listed entry point (driver_api/entry_points.hpp) is implemented by sim_<field>, with the
// parameters of the listed CUDA 13 symbol; its declaration is generated here. The other ABI
// variants the sim answers for are the second list below, the only other place that names them.
#pragma once

#include "driver_api/entry_points.hpp"

#include <cuda.h>

namespace expanse::sim {

#define EXPANSE_X(field, base, symbol, version, need, params, args) CUresult sim_##field params;
EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X

// The ABI variants outside the entry-point list: the old ABIs a driver still exports (32-bit
// sizes, earlier capture and context signatures, the unversioned names), newer ones, and the
// per-thread-default-stream (_ptsz) variants, for which the NULL stream is the calling thread's
// per-thread stream. Each counts under the entry point of the same base name.
//
// X("baseName", version, per_thread, impl, exportedSymbol, (params), (args))
//   version     the CUDA version that introduced the variant (the PFN_*_v<version> typedefs of
//               cudaTypedefs.h, CUDA 13.0); cuGetProcAddress answers the newest one not newer
//               than what it is asked for
//   per_thread  a _ptsz variant (answered for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
//   impl        the sim function (a listed entry point's own where the ABI is the same)
//   exportedSymbol is used only as a name (cuda.h #defines some of these to the _v2 names)
#define EXPANSE_SIM_OTHER_VARIANTS(X)                                                              \
  X("cuDeviceTotalMem", 2000, false, sim_device_total_mem_v1, cuDeviceTotalMem,                    \
    (unsigned int* bytes, CUdevice dev), (bytes, dev))                                             \
  X("cuDevicePrimaryCtxRelease", 7000, false,                                                      \
    sim_device_primary_ctx_release, cuDevicePrimaryCtxRelease,                                     \
    (CUdevice dev), (dev))                                                                         \
  X("cuCtxPushCurrent", 2000, false, sim_ctx_push_current, cuCtxPushCurrent,                       \
    (CUcontext ctx), (ctx))                                                                        \
  X("cuCtxPopCurrent", 2000, false, sim_ctx_pop_current, cuCtxPopCurrent, (CUcontext* ctx), (ctx)) \
  X("cuCtxSynchronize", 13000, false, sim_ctx_synchronize_v2, cuCtxSynchronize_v2,                 \
    (CUcontext ctx), (ctx))                                                                        \
  X("cuMemGetInfo", 2000, false, sim_mem_get_info_v1, cuMemGetInfo,                                \
    (unsigned int* free_bytes, unsigned int* total_bytes), (free_bytes, total_bytes))              \
  X("cuStreamDestroy", 2000, false, sim_stream_destroy, cuStreamDestroy,                           \
    (CUstream stream), (stream))                                                                   \
  X("cuStreamSynchronize", 7000, true, sim_stream_synchronize_ptsz, cuStreamSynchronize_ptsz,      \
    (CUstream stream), (stream))                                                                   \
  X("cuStreamQuery", 7000, true, sim_stream_query_ptsz, cuStreamQuery_ptsz,                        \
    (CUstream stream), (stream))                                                                   \
  X("cuStreamWaitEvent", 7000, true, sim_stream_wait_event_ptsz, cuStreamWaitEvent_ptsz,           \
    (CUstream stream, CUevent event, unsigned int flags), (stream, event, flags))                  \
  X("cuEventDestroy", 2000, false, sim_event_destroy, cuEventDestroy, (CUevent event), (event))    \
  X("cuEventRecord", 7000, true, sim_event_record_ptsz, cuEventRecord_ptsz,                        \
    (CUevent event, CUstream stream), (event, stream))                                             \
  X("cuStreamGetCtx", 9020, true, sim_stream_get_ctx_ptsz, cuStreamGetCtx_ptsz,                    \
    (CUstream stream, CUcontext* ctx), (stream, ctx))                                              \
  X("cuStreamGetCtx", 12050, false, sim_stream_get_ctx_v2, cuStreamGetCtx_v2,                      \
    (CUstream stream, CUcontext* ctx, CUgreenCtx* green), (stream, ctx, green))                    \
  X("cuStreamGetCtx", 12050, true, sim_stream_get_ctx_v2_ptsz, cuStreamGetCtx_v2_ptsz,             \
    (CUstream stream, CUcontext* ctx, CUgreenCtx* green), (stream, ctx, green))                    \
  X("cuStreamGetId", 12000, true, sim_stream_get_id_ptsz, cuStreamGetId_ptsz,                      \
    (CUstream stream, unsigned long long* id), (stream, id))                                       \
  X("cuStreamGetFlags", 7000, true, sim_stream_get_flags_ptsz, cuStreamGetFlags_ptsz,              \
    (CUstream stream, unsigned int* flags), (stream, flags))                                       \
  X("cuStreamGetDevice", 12080, true, sim_stream_get_device_ptsz, cuStreamGetDevice_ptsz,          \
    (CUstream stream, CUdevice* dev), (stream, dev))                                               \
  X("cuStreamBeginCapture", 10000, false, sim_stream_begin_capture_v1, cuStreamBeginCapture,       \
    (CUstream stream), (stream))                                                                   \
  X("cuStreamBeginCapture", 10000, true,                                                           \
    sim_stream_begin_capture_v1_ptsz, cuStreamBeginCapture_ptsz,                                   \
    (CUstream stream), (stream))                                                                   \
  X("cuStreamBeginCapture", 10010, true,                                                           \
    sim_stream_begin_capture_ptsz, cuStreamBeginCapture_v2_ptsz,                                   \
    (CUstream stream, CUstreamCaptureMode mode), (stream, mode))                                   \
  X("cuStreamEndCapture", 10000, true, sim_stream_end_capture_ptsz, cuStreamEndCapture_ptsz,       \
    (CUstream stream, CUgraph* graph), (stream, graph))                                            \
  X("cuStreamIsCapturing", 10000, true, sim_stream_is_capturing_ptsz, cuStreamIsCapturing_ptsz,    \
    (CUstream stream, CUstreamCaptureStatus* status), (stream, status))                            \
  X("cuStreamGetCaptureInfo", 10010, false,                                                        \
    sim_stream_get_capture_info_v1, cuStreamGetCaptureInfo,                                        \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id), (stream, status, id))        \
  X("cuStreamGetCaptureInfo", 10010, true,                                                         \
    sim_stream_get_capture_info_v1_ptsz, cuStreamGetCaptureInfo_ptsz,                              \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id), (stream, status, id))        \
  X("cuStreamGetCaptureInfo", 11030, false,                                                        \
    sim_stream_get_capture_info_v2, cuStreamGetCaptureInfo_v2,                                     \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,               \
     const CUgraphNode** deps, size_t* num_deps), (stream, status, id, graph, deps, num_deps))     \
  X("cuStreamGetCaptureInfo", 11030, true,                                                         \
    sim_stream_get_capture_info_v2_ptsz, cuStreamGetCaptureInfo_v2_ptsz,                           \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,               \
     const CUgraphNode** deps, size_t* num_deps), (stream, status, id, graph, deps, num_deps))     \
  X("cuStreamGetCaptureInfo", 12030, true,                                                         \
    sim_stream_get_capture_info_ptsz, cuStreamGetCaptureInfo_v3_ptsz,                              \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,               \
     const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps),                   \
    (stream, status, id, graph, deps, edges, num_deps))                                            \
  X("cuCtxGetDevice", 13000, false, sim_ctx_get_device_v2, cuCtxGetDevice_v2,                      \
    (CUdevice* dev, CUcontext ctx), (dev, ctx))                                                    \
  X("cuMemcpyHtoDAsync", 7000, true, sim_memcpy_htod_async_ptsz, cuMemcpyHtoDAsync_v2_ptsz,        \
    (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream), (dst, src, bytes, stream))  \
  X("cuMemcpyDtoHAsync", 7000, true, sim_memcpy_dtoh_async_ptsz, cuMemcpyDtoHAsync_v2_ptsz,        \
    (void* dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream))        \
  X("cuMemsetD8Async", 7000, true, sim_memset_d8_async_ptsz, cuMemsetD8Async_ptsz,                 \
    (CUdeviceptr dst, unsigned char value, size_t n, CUstream stream), (dst, value, n, stream))

#define EXPANSE_X(base, version, per_thread, impl, symbol, params, args) CUresult impl params;
EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X

// cuGetProcAddress_v2: base name + cudaVersion -> the newest variant introduced at or before
// cudaVersion. Works before cuInit. Not counted (it is not a listed entry point).
CUresult sim_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status);
// The same lookup, answering with the name of the exported symbol of the chosen variant
// ("cuMemGetInfo_v2", "cuStreamSynchronize_ptsz"): libexpanse_simcuda.so returns its own
// exported functions, so that cuGetProcAddress and dlsym agree.
CUresult sim_get_proc_symbol(const char* symbol, const char** exported, int cuda_version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult* status);
// The 4-argument CUDA 11.3 ABI (legacy cuGetProcAddress): a missing symbol or variant is
// CUDA_ERROR_NOT_FOUND.
CUresult sim_get_proc_address_v1(const char* symbol, void** pfn, int cuda_version,
                                 cuuint64_t flags);

}  // namespace expanse::sim
