// The single list of CUDA Driver API entry points expanse uses: the bottom of the driver
// vocabulary, shared by the loader (driver/) and the sim (sim/).
//
// Everything that must agree on "which driver functions exist" is generated from this list: the
// DriverTable fields, the loader (cuGetProcAddress / dlsym), the driver trace, per-entry-point
// call counters and their names in stats, and all the sim lists per entry point (its table, its
// cuGetProcAddress answers, the declarations of its implementations, the exported symbols of
// libexpanse_simcuda.so). Adding an entry point is one line here plus its sim implementation,
// sim_<field> with the listed parameters, in one of the sim's entry-point files.
//
// X(field, "baseName", exportedSymbol, version, need, (params), (args))
//   field           member name in DriverTable (snake_case: cuda.h #defines the camelCase names)
//   "baseName"      what cuGetProcAddress is asked for
//   exportedSymbol  the linker symbol a CUDA 13 client references (the _v2 name where cuda.h
//                   redirects); its declared type is the field's function-pointer type
//   version         the CUDA version that introduced that exact ABI variant; cuGetProcAddress is
//                   asked for this version so it returns the variant we were compiled against
//   need            required: the loader fails without it (every driver expanse supports has it);
//                   optional: newer than some supported drivers (12.2 = 535-series, say); the
//                   loader leaves it null where the driver is older than `version` or cannot give
//                   it, and callers ask LoadedDriver::has() first and degrade
//   (params)        exportedSymbol's parameters as cuda.h declares them (names are ours), and
//   (args)          the same names as a call's arguments: the sim defines and forwards functions
//                   of that signature (the compiler checks it against cuda.h's declaration)
//
// Old ABI variants of these entry points (32-bit sizes, _ptsz, earlier _vN) are not listed here:
// only the sim implements them (sim/sim_entry.hpp lists them).
#pragma once

#include <cuda.h>

#include <cstddef>

#define EXPANSE_DRIVER_ENTRY_POINTS(X)                                                             \
  X(get_error_name, "cuGetErrorName", cuGetErrorName, 6000, required,                              \
    (CUresult error, const char** str), (error, str))                                              \
  X(get_error_string, "cuGetErrorString", cuGetErrorString, 6000, required,                        \
    (CUresult error, const char** str), (error, str))                                              \
  X(init, "cuInit", cuInit, 2000, required, (unsigned int flags), (flags))                         \
  X(driver_get_version, "cuDriverGetVersion", cuDriverGetVersion, 2020, required,                  \
    (int* version), (version))                                                                     \
  X(device_get, "cuDeviceGet", cuDeviceGet, 2000, required,                                        \
    (CUdevice* device, int ordinal), (device, ordinal))                                            \
  X(device_get_count, "cuDeviceGetCount", cuDeviceGetCount, 2000, required, (int* count), (count)) \
  X(device_get_attribute, "cuDeviceGetAttribute", cuDeviceGetAttribute, 2000, required,            \
    (int* value, CUdevice_attribute attrib, CUdevice dev), (value, attrib, dev))                   \
  X(device_get_name, "cuDeviceGetName", cuDeviceGetName, 2000, required,                           \
    (char* name, int len, CUdevice dev), (name, len, dev))                                         \
  X(device_total_mem, "cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020, required,                     \
    (size_t* bytes, CUdevice dev), (bytes, dev))                                                   \
  X(device_primary_ctx_retain, "cuDevicePrimaryCtxRetain",                                         \
    cuDevicePrimaryCtxRetain, 7000, required,                                                      \
    (CUcontext* ctx, CUdevice dev), (ctx, dev))                                                    \
  X(device_primary_ctx_release, "cuDevicePrimaryCtxRelease",                                       \
    cuDevicePrimaryCtxRelease_v2, 11000, required,                                                 \
    (CUdevice dev), (dev))                                                                         \
  X(ctx_get_current, "cuCtxGetCurrent", cuCtxGetCurrent, 4000, required, (CUcontext* ctx), (ctx))  \
  X(ctx_set_current, "cuCtxSetCurrent", cuCtxSetCurrent, 4000, required, (CUcontext ctx), (ctx))   \
  X(ctx_push_current, "cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000, required,                     \
    (CUcontext ctx), (ctx))                                                                        \
  X(ctx_pop_current, "cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000, required,                        \
    (CUcontext* ctx), (ctx))                                                                       \
  X(ctx_synchronize, "cuCtxSynchronize", cuCtxSynchronize, 2000, required, (), ())                 \
  X(mem_get_info, "cuMemGetInfo", cuMemGetInfo_v2, 3020, required,                                 \
    (size_t* free_bytes, size_t* total_bytes), (free_bytes, total_bytes))                          \
  X(mem_address_reserve, "cuMemAddressReserve", cuMemAddressReserve, 10020, required,              \
    (CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,                            \
     unsigned long long flags), (ptr, size, alignment, addr, flags))                               \
  X(mem_address_free, "cuMemAddressFree", cuMemAddressFree, 10020, required,                       \
    (CUdeviceptr ptr, size_t size), (ptr, size))                                                   \
  X(mem_create, "cuMemCreate", cuMemCreate, 10020, required,                                       \
    (CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,           \
     unsigned long long flags), (handle, size, prop, flags))                                       \
  X(mem_release, "cuMemRelease", cuMemRelease, 10020, required,                                    \
    (CUmemGenericAllocationHandle handle), (handle))                                               \
  X(mem_map, "cuMemMap", cuMemMap, 10020, required,                                                \
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,             \
     unsigned long long flags), (ptr, size, offset, handle, flags))                                \
  X(mem_unmap, "cuMemUnmap", cuMemUnmap, 10020, required,                                          \
    (CUdeviceptr ptr, size_t size), (ptr, size))                                                   \
  X(mem_set_access, "cuMemSetAccess", cuMemSetAccess, 10020, required,                             \
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count),                     \
    (ptr, size, desc, count))                                                                      \
  X(mem_get_access, "cuMemGetAccess", cuMemGetAccess, 10020, required,                             \
    (unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr),                   \
    (flags, location, ptr))                                                                        \
  X(mem_get_allocation_granularity, "cuMemGetAllocationGranularity",                               \
    cuMemGetAllocationGranularity, 10020, required,                                                \
    (size_t* granularity, const CUmemAllocationProp* prop,                                         \
     CUmemAllocationGranularity_flags option), (granularity, prop, option))                        \
  X(mem_get_allocation_properties_from_handle, "cuMemGetAllocationPropertiesFromHandle",           \
    cuMemGetAllocationPropertiesFromHandle, 10020, required,                                       \
    (CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle), (prop, handle))              \
  X(mem_retain_allocation_handle, "cuMemRetainAllocationHandle",                                   \
    cuMemRetainAllocationHandle, 11000, required,                                                  \
    (CUmemGenericAllocationHandle* handle, void* addr), (handle, addr))                            \
  X(stream_create, "cuStreamCreate", cuStreamCreate, 2000, required,                               \
    (CUstream* stream, unsigned int flags), (stream, flags))                                       \
  X(stream_destroy, "cuStreamDestroy", cuStreamDestroy_v2, 4000, required,                         \
    (CUstream stream), (stream))                                                                   \
  X(stream_synchronize, "cuStreamSynchronize", cuStreamSynchronize, 2000, required,                \
    (CUstream stream), (stream))                                                                   \
  X(stream_query, "cuStreamQuery", cuStreamQuery, 2000, required, (CUstream stream), (stream))     \
  X(stream_wait_event, "cuStreamWaitEvent", cuStreamWaitEvent, 3020, required,                     \
    (CUstream stream, CUevent event, unsigned int flags), (stream, event, flags))                  \
  X(event_create, "cuEventCreate", cuEventCreate, 2000, required,                                  \
    (CUevent* event, unsigned int flags), (event, flags))                                          \
  X(event_destroy, "cuEventDestroy", cuEventDestroy_v2, 4000, required, (CUevent event), (event))  \
  X(event_record, "cuEventRecord", cuEventRecord, 2000, required,                                  \
    (CUevent event, CUstream stream), (event, stream))                                             \
  X(event_query, "cuEventQuery", cuEventQuery, 2000, required, (CUevent event), (event))           \
  X(event_synchronize, "cuEventSynchronize", cuEventSynchronize, 2000, required,                   \
    (CUevent event), (event))                                                                      \
  X(memcpy_htod, "cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020, required,                                  \
    (CUdeviceptr dst, const void* src, size_t bytes), (dst, src, bytes))                           \
  X(memcpy_dtoh, "cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020, required,                                  \
    (void* dst, CUdeviceptr src, size_t bytes), (dst, src, bytes))                                 \
  X(stream_get_ctx, "cuStreamGetCtx", cuStreamGetCtx, 9020, required,                              \
    (CUstream stream, CUcontext* ctx), (stream, ctx))                                              \
  X(stream_get_id, "cuStreamGetId", cuStreamGetId, 12000, optional,                                \
    (CUstream stream, unsigned long long* id), (stream, id))                                       \
  X(stream_get_flags, "cuStreamGetFlags", cuStreamGetFlags, 5050, required,                        \
    (CUstream stream, unsigned int* flags), (stream, flags))                                       \
  X(stream_get_device, "cuStreamGetDevice", cuStreamGetDevice, 12080, optional,                    \
    (CUstream stream, CUdevice* dev), (stream, dev))                                               \
  X(stream_begin_capture, "cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010, required,        \
    (CUstream stream, CUstreamCaptureMode mode), (stream, mode))                                   \
  X(stream_end_capture, "cuStreamEndCapture", cuStreamEndCapture, 10000, required,                 \
    (CUstream stream, CUgraph* graph), (stream, graph))                                            \
  X(stream_is_capturing, "cuStreamIsCapturing", cuStreamIsCapturing, 10000, required,              \
    (CUstream stream, CUstreamCaptureStatus* status), (stream, status))                            \
  X(stream_get_capture_info, "cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v3, 12030, optional, \
    (CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,               \
     const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps),                   \
    (stream, status, id, graph, deps, edges, num_deps))                                            \
  X(thread_exchange_stream_capture_mode, "cuThreadExchangeStreamCaptureMode",                      \
    cuThreadExchangeStreamCaptureMode, 10010, required,                                            \
    (CUstreamCaptureMode* mode), (mode))                                                           \
  X(graph_destroy, "cuGraphDestroy", cuGraphDestroy, 10000, required, (CUgraph graph), (graph))    \
  X(device_can_access_peer, "cuDeviceCanAccessPeer", cuDeviceCanAccessPeer, 4000, required,        \
    (int* can, CUdevice dev, CUdevice peer), (can, dev, peer))                                     \
  X(ctx_get_device, "cuCtxGetDevice", cuCtxGetDevice, 2000, required, (CUdevice* dev), (dev))      \
  X(ctx_get_id, "cuCtxGetId", cuCtxGetId, 12000, optional,                                         \
    (CUcontext ctx, unsigned long long* id), (ctx, id))                                            \
  X(mem_host_alloc, "cuMemHostAlloc", cuMemHostAlloc, 2020, required,                              \
    (void** pp, size_t bytes, unsigned int flags), (pp, bytes, flags))                             \
  X(mem_free_host, "cuMemFreeHost", cuMemFreeHost, 2000, required, (void* p), (p))                 \
  X(mem_host_register, "cuMemHostRegister", cuMemHostRegister_v2, 6050, required,                  \
    (void* p, size_t bytes, unsigned int flags), (p, bytes, flags))                                \
  X(mem_host_unregister, "cuMemHostUnregister", cuMemHostUnregister, 4000, required, (void* p),    \
    (p))                                                                                           \
  X(memcpy_dtoh_async, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, 3020, required,                  \
    (void* dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream))        \
  X(memcpy_htod_async, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, 3020, required,                  \
    (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream), (dst, src, bytes, stream))  \
  X(memset_d8_async, "cuMemsetD8Async", cuMemsetD8Async, 3020, required,                           \
    (CUdeviceptr dst, unsigned char value, size_t n, CUstream stream), (dst, value, n, stream))  \
  X(mem_export_to_shareable_handle, "cuMemExportToShareableHandle",                               \
    cuMemExportToShareableHandle, 10020, required,                                                 \
    (void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,         \
     unsigned long long flags), (shareable, handle, type, flags))                                  \
  X(mem_import_from_shareable_handle, "cuMemImportFromShareableHandle",                            \
    cuMemImportFromShareableHandle, 10020, required,                                               \
    (CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type),       \
    (handle, os_handle, type))                                                                     \
  X(mem_get_address_range, "cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020, required,       \
    (CUdeviceptr* base, size_t* size, CUdeviceptr ptr), (base, size, ptr))

namespace expanse::driver {

// One index per entry point, in list order; used to index call counters and cost tables.
enum class EntryPoint : int {
#define EXPANSE_X(field, base, symbol, version, need, ...) field,
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
};

inline constexpr int kEntryPointCount = 0
#define EXPANSE_X(field, base, symbol, version, need, ...) +1
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
    ;

// The base name of an entry point ("cuMemMap"), as cuGetProcAddress and stats spell it.
const char* entry_point_name(EntryPoint e) noexcept;
// The exported symbol ("cuMemGetInfo_v2"), as dlsym and the sim shared library spell it.
const char* entry_point_symbol(EntryPoint e) noexcept;
// The CUDA version whose ABI variant we call.
int entry_point_version(EntryPoint e) noexcept;
// False for the optional entry points (the `need` column), which a driver may lack.
bool entry_point_required(EntryPoint e) noexcept;

}  // namespace expanse::driver
