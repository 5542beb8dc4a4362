// The single list of CUDA Driver API entry points expanse uses.
//
// Everything that must agree on "which driver functions exist" is generated from this list:
// the DriverTable fields, the loader (cuGetProcAddress / dlsym), the sim's table, per-entry-point
// call counters and their names in stats. Adding an entry point is one line here.
//
// X(field, "baseName", exportedSymbol, version, need)
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
#pragma once

#include <cuda.h>

#include <cstddef>

#define EXPANSE_DRIVER_ENTRY_POINTS(X)                                                            \
  X(get_error_name, "cuGetErrorName", cuGetErrorName, 6000, required)                             \
  X(get_error_string, "cuGetErrorString", cuGetErrorString, 6000, required)                       \
  X(init, "cuInit", cuInit, 2000, required)                                                       \
  X(driver_get_version, "cuDriverGetVersion", cuDriverGetVersion, 2020, required)                 \
  X(device_get, "cuDeviceGet", cuDeviceGet, 2000, required)                                       \
  X(device_get_count, "cuDeviceGetCount", cuDeviceGetCount, 2000, required)                       \
  X(device_get_attribute, "cuDeviceGetAttribute", cuDeviceGetAttribute, 2000, required)           \
  X(device_get_name, "cuDeviceGetName", cuDeviceGetName, 2000, required)                          \
  X(device_total_mem, "cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020, required)                    \
  X(device_primary_ctx_retain, "cuDevicePrimaryCtxRetain",                                        \
    cuDevicePrimaryCtxRetain, 7000, required)                                                     \
  X(device_primary_ctx_release, "cuDevicePrimaryCtxRelease",                                      \
    cuDevicePrimaryCtxRelease_v2, 11000, required)                                                \
  X(ctx_get_current, "cuCtxGetCurrent", cuCtxGetCurrent, 4000, required)                          \
  X(ctx_set_current, "cuCtxSetCurrent", cuCtxSetCurrent, 4000, required)                          \
  X(ctx_push_current, "cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000, required)                    \
  X(ctx_pop_current, "cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000, required)                       \
  X(ctx_synchronize, "cuCtxSynchronize", cuCtxSynchronize, 2000, required)                        \
  X(mem_get_info, "cuMemGetInfo", cuMemGetInfo_v2, 3020, required)                                \
  X(mem_address_reserve, "cuMemAddressReserve", cuMemAddressReserve, 10020, required)             \
  X(mem_address_free, "cuMemAddressFree", cuMemAddressFree, 10020, required)                      \
  X(mem_create, "cuMemCreate", cuMemCreate, 10020, required)                                      \
  X(mem_release, "cuMemRelease", cuMemRelease, 10020, required)                                   \
  X(mem_map, "cuMemMap", cuMemMap, 10020, required)                                               \
  X(mem_unmap, "cuMemUnmap", cuMemUnmap, 10020, required)                                         \
  X(mem_set_access, "cuMemSetAccess", cuMemSetAccess, 10020, required)                            \
  X(mem_get_access, "cuMemGetAccess", cuMemGetAccess, 10020, required)                            \
  X(mem_get_allocation_granularity, "cuMemGetAllocationGranularity",                              \
    cuMemGetAllocationGranularity, 10020, required)                                               \
  X(mem_get_allocation_properties_from_handle, "cuMemGetAllocationPropertiesFromHandle",          \
    cuMemGetAllocationPropertiesFromHandle, 10020, required)                                      \
  X(mem_retain_allocation_handle, "cuMemRetainAllocationHandle",                                  \
    cuMemRetainAllocationHandle, 11000, required)                                                 \
  X(stream_create, "cuStreamCreate", cuStreamCreate, 2000, required)                              \
  X(stream_destroy, "cuStreamDestroy", cuStreamDestroy_v2, 4000, required)                        \
  X(stream_synchronize, "cuStreamSynchronize", cuStreamSynchronize, 2000, required)               \
  X(stream_query, "cuStreamQuery", cuStreamQuery, 2000, required)                                 \
  X(stream_wait_event, "cuStreamWaitEvent", cuStreamWaitEvent, 3020, required)                    \
  X(event_create, "cuEventCreate", cuEventCreate, 2000, required)                                 \
  X(event_destroy, "cuEventDestroy", cuEventDestroy_v2, 4000, required)                           \
  X(event_record, "cuEventRecord", cuEventRecord, 2000, required)                                 \
  X(event_query, "cuEventQuery", cuEventQuery, 2000, required)                                    \
  X(event_synchronize, "cuEventSynchronize", cuEventSynchronize, 2000, required)                  \
  X(memcpy_htod, "cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020, required)                                 \
  X(memcpy_dtoh, "cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020, required)                                 \
  X(stream_get_ctx, "cuStreamGetCtx", cuStreamGetCtx, 9020, required)                             \
  X(stream_get_id, "cuStreamGetId", cuStreamGetId, 12000, optional)                               \
  X(stream_get_flags, "cuStreamGetFlags", cuStreamGetFlags, 5050, required)                       \
  X(stream_get_device, "cuStreamGetDevice", cuStreamGetDevice, 12080, optional)                   \
  X(stream_begin_capture, "cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010, required)       \
  X(stream_end_capture, "cuStreamEndCapture", cuStreamEndCapture, 10000, required)                \
  X(stream_is_capturing, "cuStreamIsCapturing", cuStreamIsCapturing, 10000, required)             \
  X(stream_get_capture_info, "cuStreamGetCaptureInfo",                                            \
    cuStreamGetCaptureInfo_v3, 12030, optional)                                                   \
  X(thread_exchange_stream_capture_mode, "cuThreadExchangeStreamCaptureMode",                     \
    cuThreadExchangeStreamCaptureMode, 10010, required)                                           \
  X(graph_destroy, "cuGraphDestroy", cuGraphDestroy, 10000, required)                             \
  X(device_can_access_peer, "cuDeviceCanAccessPeer", cuDeviceCanAccessPeer, 4000, required)       \
  X(ctx_get_device, "cuCtxGetDevice", cuCtxGetDevice, 2000, required)                             \
  X(ctx_get_id, "cuCtxGetId", cuCtxGetId, 12000, optional)

namespace expanse::driver {

// One index per entry point, in list order; used to index call counters and cost tables.
enum class EntryPoint : int {
#define EXPANSE_X(field, base, symbol, version, need) field,
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
};

inline constexpr int kEntryPointCount = 0
#define EXPANSE_X(field, base, symbol, version, need) +1
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
