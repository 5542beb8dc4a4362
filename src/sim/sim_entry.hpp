// The sim's driver entry points as plain functions (what table() points at, and what
// libexpanse_simcuda.so exports under the real symbol names). Signatures are exactly those of the
// CUDA 13 symbols named in the comments; legacy (old-ABI) variants are the *_v1 functions.
#pragma once

#include <cuda.h>

namespace expanse::sim {

CUresult sim_get_error_name(CUresult error, const char** str);
CUresult sim_get_error_string(CUresult error, const char** str);
CUresult sim_init(unsigned int flags);
CUresult sim_driver_get_version(int* version);
CUresult sim_device_get(CUdevice* device, int ordinal);
CUresult sim_device_get_count(int* count);
CUresult sim_device_get_attribute(int* value, CUdevice_attribute attrib, CUdevice dev);
CUresult sim_device_get_name(char* name, int len, CUdevice dev);
CUresult sim_device_total_mem(size_t* bytes, CUdevice dev);  // cuDeviceTotalMem_v2
CUresult sim_device_primary_ctx_retain(CUcontext* ctx, CUdevice dev);
CUresult sim_device_primary_ctx_release(CUdevice dev);  // ..._v2 (and v1)
CUresult sim_ctx_get_current(CUcontext* ctx);
CUresult sim_ctx_set_current(CUcontext ctx);
CUresult sim_ctx_push_current(CUcontext ctx);                        // _v2 (and v1)
CUresult sim_ctx_pop_current(CUcontext* ctx);                        // _v2 (and v1)
CUresult sim_ctx_synchronize();                                      // cuCtxSynchronize
CUresult sim_mem_get_info(size_t* free_bytes, size_t* total_bytes);  // cuMemGetInfo_v2
CUresult sim_mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags);
CUresult sim_mem_address_free(CUdeviceptr ptr, size_t size);
CUresult sim_mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags);
CUresult sim_mem_release(CUmemGenericAllocationHandle handle);
CUresult sim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult sim_mem_unmap(CUdeviceptr ptr, size_t size);
CUresult sim_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                            size_t count);
CUresult sim_mem_get_access(unsigned long long* flags, const CUmemLocation* location,
                            CUdeviceptr ptr);
CUresult sim_mem_get_allocation_granularity(size_t* granularity, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags option);
CUresult sim_mem_get_allocation_properties_from_handle(CUmemAllocationProp* prop,
                                                       CUmemGenericAllocationHandle handle);
CUresult sim_mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr);
CUresult sim_stream_create(CUstream* stream, unsigned int flags);
CUresult sim_stream_destroy(CUstream stream);  // _v2 (and v1)
CUresult sim_stream_synchronize(CUstream stream);
CUresult sim_stream_query(CUstream stream);
CUresult sim_stream_wait_event(CUstream stream, CUevent event, unsigned int flags);
CUresult sim_event_create(CUevent* event, unsigned int flags);
CUresult sim_event_destroy(CUevent event);  // _v2 (and v1)
CUresult sim_event_record(CUevent event, CUstream stream);
CUresult sim_event_query(CUevent event);
CUresult sim_event_synchronize(CUevent event);
CUresult sim_memcpy_htod(CUdeviceptr dst, const void* src, size_t bytes);  // cuMemcpyHtoD_v2
CUresult sim_memcpy_dtoh(void* dst, CUdeviceptr src, size_t bytes);        // cuMemcpyDtoH_v2
CUresult sim_stream_get_ctx(CUstream stream, CUcontext* ctx);
CUresult sim_stream_get_id(CUstream stream, unsigned long long* id);
CUresult sim_stream_get_flags(CUstream stream, unsigned int* flags);
CUresult sim_stream_get_device(CUstream stream, CUdevice* dev);
CUresult sim_stream_begin_capture(CUstream stream, CUstreamCaptureMode mode);  // _v2
CUresult sim_stream_end_capture(CUstream stream, CUgraph* graph);
CUresult sim_stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status);
CUresult sim_stream_get_capture_info(CUstream stream, CUstreamCaptureStatus* status,
                                     cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                     const CUgraphEdgeData** edges, size_t* num_deps);  // _v3
CUresult sim_thread_exchange_stream_capture_mode(CUstreamCaptureMode* mode);
CUresult sim_graph_destroy(CUgraph graph);
CUresult sim_device_can_access_peer(int* can, CUdevice dev, CUdevice peer);
CUresult sim_ctx_get_device(CUdevice* dev);
CUresult sim_ctx_get_id(CUcontext ctx, unsigned long long* id);

// Variants outside the entry-point list (counted under the entry point of the same base name).
CUresult sim_ctx_synchronize_v2(CUcontext ctx);  // cuCtxSynchronize_v2
CUresult sim_mem_get_info_v1(unsigned int* free_bytes, unsigned int* total_bytes);  // cuMemGetInfo
CUresult sim_device_total_mem_v1(unsigned int* bytes, CUdevice dev);  // cuDeviceTotalMem
CUresult sim_stream_get_ctx_v2(CUstream stream, CUcontext* ctx, CUgreenCtx* green);  // 12.5
CUresult sim_stream_begin_capture_v1(CUstream stream);  // cuStreamBeginCapture (10.0 ABI)
CUresult sim_stream_get_capture_info_v1(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id);  // cuStreamGetCaptureInfo (10.1 ABI)
CUresult sim_stream_get_capture_info_v2(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** deps,
                                        size_t* num_deps);  // cuStreamGetCaptureInfo_v2
CUresult sim_ctx_get_device_v2(CUdevice* dev, CUcontext ctx);  // cuCtxGetDevice_v2 (13.0)
// The _ptsz variants: the NULL stream is the calling thread's per-thread stream.
CUresult sim_stream_synchronize_ptsz(CUstream stream);
CUresult sim_stream_query_ptsz(CUstream stream);
CUresult sim_stream_wait_event_ptsz(CUstream stream, CUevent event, unsigned int flags);
CUresult sim_event_record_ptsz(CUevent event, CUstream stream);
CUresult sim_stream_get_ctx_ptsz(CUstream stream, CUcontext* ctx);
CUresult sim_stream_get_ctx_v2_ptsz(CUstream stream, CUcontext* ctx, CUgreenCtx* green);
CUresult sim_stream_get_id_ptsz(CUstream stream, unsigned long long* id);
CUresult sim_stream_get_flags_ptsz(CUstream stream, unsigned int* flags);
CUresult sim_stream_get_device_ptsz(CUstream stream, CUdevice* dev);
CUresult sim_stream_begin_capture_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult sim_stream_begin_capture_v1_ptsz(CUstream stream);
CUresult sim_stream_end_capture_ptsz(CUstream stream, CUgraph* graph);
CUresult sim_stream_is_capturing_ptsz(CUstream stream, CUstreamCaptureStatus* status);
CUresult sim_stream_get_capture_info_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                          cuuint64_t* id, CUgraph* graph,
                                          const CUgraphNode** deps,
                                          const CUgraphEdgeData** edges, size_t* num_deps);
CUresult sim_stream_get_capture_info_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id, CUgraph* graph,
                                             const CUgraphNode** deps, size_t* num_deps);
CUresult sim_stream_get_capture_info_v1_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id);

// cuGetProcAddress_v2 (spec §1.3): base name + cudaVersion -> the newest variant introduced at or
// before cudaVersion. Works before cuInit. Not counted (it is not a listed entry point).
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
