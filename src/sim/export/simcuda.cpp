// libexpanse_simcuda.so: the sim under the symbol names a CUDA 13 client links against
// (cuda.h's #defines turn e.g. cuMemGetInfo into cuMemGetInfo_v2), plus cuGetProcAddress_v2, the
// _ptsz stream variants and the C control functions of expanse_sim_control.h. The legacy
// old-ABI names live in simcuda_legacy.cpp.
#pragma GCC visibility push(default)
#include <cuda.h>

#include "sim/export/expanse_sim_control.h"
#pragma GCC visibility pop

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "conf/env_config.hpp"
#include "sim/export/simcuda_internal.hpp"
#include "sim/sim.hpp"
#include "sim/sim_entry.hpp"

#define EXPANSE_EXPORT extern "C" __attribute__((visibility("default")))

namespace expanse::sim::exported {
namespace {

std::atomic<bool> g_configured{false};
std::mutex g_configure_mutex;
thread_local std::string t_last_error;
thread_local std::string t_description;

bool entry_point_by_name(const char* name, driver::EntryPoint* out) {
  if (name == nullptr) return false;
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    if (std::strcmp(driver::entry_point_name(e), name) == 0 ||
        std::strcmp(driver::entry_point_symbol(e), name) == 0) {
      *out = e;
      return true;
    }
  }
  return false;
}

}  // namespace

void ensure_configured() noexcept {
  if (g_configured.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  if (g_configured.load(std::memory_order_relaxed)) return;
  try {
    reset(sim_config_from_string(conf::from_environment()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libexpanse_simcuda: %s; the sim has no devices\n", e.what());
    try {
      SimConfig none;
      none.devices = 0;
      reset(none);
    } catch (...) {
    }
  }
  g_configured.store(true, std::memory_order_release);
}

}  // namespace expanse::sim::exported

using expanse::sim::exported::ensure_configured;
namespace sim = expanse::sim;

// ---- driver API (current ABI)
// ---------------------------------------------------------------------

EXPANSE_EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
  ensure_configured();
  return sim::sim_get_error_name(error, str);
}
EXPANSE_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  ensure_configured();
  return sim::sim_get_error_string(error, str);
}
EXPANSE_EXPORT CUresult cuInit(unsigned int flags) {
  ensure_configured();
  return sim::sim_init(flags);
}
EXPANSE_EXPORT CUresult cuDriverGetVersion(int* version) {
  ensure_configured();
  return sim::sim_driver_get_version(version);
}
EXPANSE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  ensure_configured();
  return sim::sim_device_get(device, ordinal);
}
EXPANSE_EXPORT CUresult cuDeviceGetCount(int* count) {
  ensure_configured();
  return sim::sim_device_get_count(count);
}
EXPANSE_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  ensure_configured();
  return sim::sim_device_get_attribute(value, attrib, dev);
}
EXPANSE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  ensure_configured();
  return sim::sim_device_get_name(name, len, dev);
}
EXPANSE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  ensure_configured();
  return sim::sim_device_total_mem(bytes, dev);
}
EXPANSE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  ensure_configured();
  return sim::sim_device_primary_ctx_retain(ctx, dev);
}
EXPANSE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  ensure_configured();
  return sim::sim_device_primary_ctx_release(dev);
}
EXPANSE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  ensure_configured();
  return sim::sim_ctx_get_current(ctx);
}
EXPANSE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  ensure_configured();
  return sim::sim_ctx_set_current(ctx);
}
EXPANSE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  ensure_configured();
  return sim::sim_ctx_push_current(ctx);
}
EXPANSE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  ensure_configured();
  return sim::sim_ctx_pop_current(ctx);
}
EXPANSE_EXPORT CUresult cuCtxSynchronize() {
  ensure_configured();
  return sim::sim_ctx_synchronize();
}
EXPANSE_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  ensure_configured();
  return sim::sim_ctx_synchronize_v2(ctx);
}
EXPANSE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  ensure_configured();
  return sim::sim_mem_get_info(free_bytes, total_bytes);
}
EXPANSE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags) {
  ensure_configured();
  return sim::sim_mem_address_reserve(ptr, size, alignment, addr, flags);
}
EXPANSE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ensure_configured();
  return sim::sim_mem_address_free(ptr, size);
}
EXPANSE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  ensure_configured();
  return sim::sim_mem_create(handle, size, prop, flags);
}
EXPANSE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  ensure_configured();
  return sim::sim_mem_release(handle);
}
EXPANSE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  ensure_configured();
  return sim::sim_mem_map(ptr, size, offset, handle, flags);
}
EXPANSE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  ensure_configured();
  return sim::sim_mem_unmap(ptr, size);
}
EXPANSE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                       size_t count) {
  ensure_configured();
  return sim::sim_mem_set_access(ptr, size, desc, count);
}
EXPANSE_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                       CUdeviceptr ptr) {
  ensure_configured();
  return sim::sim_mem_get_access(flags, location, ptr);
}
EXPANSE_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                      const CUmemAllocationProp* prop,
                                                      CUmemAllocationGranularity_flags option) {
  ensure_configured();
  return sim::sim_mem_get_allocation_granularity(granularity, prop, option);
}
EXPANSE_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  ensure_configured();
  return sim::sim_mem_get_allocation_properties_from_handle(prop, handle);
}
EXPANSE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                    void* addr) {
  ensure_configured();
  return sim::sim_mem_retain_allocation_handle(handle, addr);
}
EXPANSE_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  ensure_configured();
  return sim::sim_stream_create(stream, flags);
}
EXPANSE_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_destroy(stream);
}
EXPANSE_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_synchronize(stream);
}
EXPANSE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_synchronize_ptsz(stream);
}
EXPANSE_EXPORT CUresult cuStreamQuery(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_query(stream);
}
EXPANSE_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream) {
  ensure_configured();
  return sim::sim_stream_query_ptsz(stream);
}
EXPANSE_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  ensure_configured();
  return sim::sim_stream_wait_event(stream, event, flags);
}
EXPANSE_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  ensure_configured();
  return sim::sim_stream_wait_event_ptsz(stream, event, flags);
}
EXPANSE_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  ensure_configured();
  return sim::sim_event_create(event, flags);
}
EXPANSE_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
  ensure_configured();
  return sim::sim_event_destroy(event);
}
EXPANSE_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
  ensure_configured();
  return sim::sim_event_record(event, stream);
}
EXPANSE_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  ensure_configured();
  return sim::sim_event_record_ptsz(event, stream);
}
EXPANSE_EXPORT CUresult cuEventQuery(CUevent event) {
  ensure_configured();
  return sim::sim_event_query(event);
}
EXPANSE_EXPORT CUresult cuEventSynchronize(CUevent event) {
  ensure_configured();
  return sim::sim_event_synchronize(event);
}
EXPANSE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                        size_t ByteCount) {
  ensure_configured();
  return sim::sim_memcpy_htod(dstDevice, srcHost, ByteCount);
}
EXPANSE_EXPORT CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  ensure_configured();
  return sim::sim_memcpy_dtoh(dstHost, srcDevice, ByteCount);
}
EXPANSE_EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  ensure_configured();
  return sim::sim_stream_get_ctx(stream, ctx);
}
EXPANSE_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream stream, CUcontext* ctx) {
  ensure_configured();
  return sim::sim_stream_get_ctx_ptsz(stream, ctx);
}
EXPANSE_EXPORT CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  ensure_configured();
  return sim::sim_stream_get_ctx_v2(stream, ctx, green);
}
EXPANSE_EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  ensure_configured();
  return sim::sim_stream_get_ctx_v2_ptsz(stream, ctx, green);
}
EXPANSE_EXPORT CUresult cuStreamGetId(CUstream stream, unsigned long long* id) {
  ensure_configured();
  return sim::sim_stream_get_id(stream, id);
}
EXPANSE_EXPORT CUresult cuStreamGetId_ptsz(CUstream stream, unsigned long long* id) {
  ensure_configured();
  return sim::sim_stream_get_id_ptsz(stream, id);
}
EXPANSE_EXPORT CUresult cuStreamGetFlags(CUstream stream, unsigned int* flags) {
  ensure_configured();
  return sim::sim_stream_get_flags(stream, flags);
}
EXPANSE_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream stream, unsigned int* flags) {
  ensure_configured();
  return sim::sim_stream_get_flags_ptsz(stream, flags);
}
EXPANSE_EXPORT CUresult cuStreamGetDevice(CUstream stream, CUdevice* dev) {
  ensure_configured();
  return sim::sim_stream_get_device(stream, dev);
}
EXPANSE_EXPORT CUresult cuStreamGetDevice_ptsz(CUstream stream, CUdevice* dev) {
  ensure_configured();
  return sim::sim_stream_get_device_ptsz(stream, dev);
}
EXPANSE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  ensure_configured();
  return sim::sim_stream_begin_capture(stream, mode);
}
EXPANSE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  ensure_configured();
  return sim::sim_stream_begin_capture_ptsz(stream, mode);
}
EXPANSE_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  ensure_configured();
  return sim::sim_stream_end_capture(stream, graph);
}
EXPANSE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  ensure_configured();
  return sim::sim_stream_end_capture_ptsz(stream, graph);
}
EXPANSE_EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  ensure_configured();
  return sim::sim_stream_is_capturing(stream, status);
}
EXPANSE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  ensure_configured();
  return sim::sim_stream_is_capturing_ptsz(stream, status);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps) {
  ensure_configured();
  return sim::sim_stream_get_capture_info(stream, status, id, graph, deps, edges, num_deps);
}
EXPANSE_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps) {
  ensure_configured();
  return sim::sim_stream_get_capture_info_ptsz(stream, status, id, graph, deps, edges, num_deps);
}
EXPANSE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  ensure_configured();
  return sim::sim_thread_exchange_stream_capture_mode(mode);
}
EXPANSE_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  ensure_configured();
  return sim::sim_graph_destroy(graph);
}
EXPANSE_EXPORT CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  ensure_configured();
  return sim::sim_device_can_access_peer(can, dev, peer);
}
EXPANSE_EXPORT CUresult cuCtxGetDevice(CUdevice* dev) {
  ensure_configured();
  return sim::sim_ctx_get_device(dev);
}
EXPANSE_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx) {
  ensure_configured();
  return sim::sim_ctx_get_device_v2(dev, ctx);
}
EXPANSE_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  ensure_configured();
  return sim::sim_ctx_get_id(ctx, id);
}
EXPANSE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status) {
  ensure_configured();
  return expanse::sim::exported::proc_address(symbol, pfn, cudaVersion, flags, status);
}

// ---- cuGetProcAddress answers with this library's exported functions ----------------------------

namespace expanse::sim::exported {
namespace {

template <class F>
void* fp(F* f) noexcept {
  return reinterpret_cast<void*>(f);
}

const Export kExports[] = {
    {"cuGetErrorName", fp(&cuGetErrorName)},
    {"cuGetErrorString", fp(&cuGetErrorString)},
    {"cuInit", fp(&cuInit)},
    {"cuDriverGetVersion", fp(&cuDriverGetVersion)},
    {"cuDeviceGet", fp(&cuDeviceGet)},
    {"cuDeviceGetCount", fp(&cuDeviceGetCount)},
    {"cuDeviceGetAttribute", fp(&cuDeviceGetAttribute)},
    {"cuDeviceGetName", fp(&cuDeviceGetName)},
    {"cuDeviceTotalMem_v2", fp(&cuDeviceTotalMem_v2)},
    {"cuDevicePrimaryCtxRetain", fp(&cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease_v2", fp(&cuDevicePrimaryCtxRelease_v2)},
    {"cuCtxGetCurrent", fp(&cuCtxGetCurrent)},
    {"cuCtxSetCurrent", fp(&cuCtxSetCurrent)},
    {"cuCtxPushCurrent_v2", fp(&cuCtxPushCurrent_v2)},
    {"cuCtxPopCurrent_v2", fp(&cuCtxPopCurrent_v2)},
    {"cuCtxSynchronize", fp(&cuCtxSynchronize)},
    {"cuCtxSynchronize_v2", fp(&cuCtxSynchronize_v2)},
    {"cuMemGetInfo_v2", fp(&cuMemGetInfo_v2)},
    {"cuMemAddressReserve", fp(&cuMemAddressReserve)},
    {"cuMemAddressFree", fp(&cuMemAddressFree)},
    {"cuMemCreate", fp(&cuMemCreate)},
    {"cuMemRelease", fp(&cuMemRelease)},
    {"cuMemMap", fp(&cuMemMap)},
    {"cuMemUnmap", fp(&cuMemUnmap)},
    {"cuMemSetAccess", fp(&cuMemSetAccess)},
    {"cuMemGetAccess", fp(&cuMemGetAccess)},
    {"cuMemGetAllocationGranularity", fp(&cuMemGetAllocationGranularity)},
    {"cuMemGetAllocationPropertiesFromHandle", fp(&cuMemGetAllocationPropertiesFromHandle)},
    {"cuMemRetainAllocationHandle", fp(&cuMemRetainAllocationHandle)},
    {"cuStreamCreate", fp(&cuStreamCreate)},
    {"cuStreamDestroy_v2", fp(&cuStreamDestroy_v2)},
    {"cuStreamSynchronize", fp(&cuStreamSynchronize)},
    {"cuStreamSynchronize_ptsz", fp(&cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", fp(&cuStreamQuery)},
    {"cuStreamQuery_ptsz", fp(&cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent", fp(&cuStreamWaitEvent)},
    {"cuStreamWaitEvent_ptsz", fp(&cuStreamWaitEvent_ptsz)},
    {"cuEventCreate", fp(&cuEventCreate)},
    {"cuEventDestroy_v2", fp(&cuEventDestroy_v2)},
    {"cuEventRecord", fp(&cuEventRecord)},
    {"cuEventRecord_ptsz", fp(&cuEventRecord_ptsz)},
    {"cuEventQuery", fp(&cuEventQuery)},
    {"cuEventSynchronize", fp(&cuEventSynchronize)},
    {"cuMemcpyHtoD_v2", fp(&cuMemcpyHtoD_v2)},
    {"cuMemcpyDtoH_v2", fp(&cuMemcpyDtoH_v2)},
    {"cuStreamGetCtx", fp(&cuStreamGetCtx)},
    {"cuStreamGetCtx_ptsz", fp(&cuStreamGetCtx_ptsz)},
    {"cuStreamGetCtx_v2", fp(&cuStreamGetCtx_v2)},
    {"cuStreamGetCtx_v2_ptsz", fp(&cuStreamGetCtx_v2_ptsz)},
    {"cuStreamGetId", fp(&cuStreamGetId)},
    {"cuStreamGetId_ptsz", fp(&cuStreamGetId_ptsz)},
    {"cuStreamGetFlags", fp(&cuStreamGetFlags)},
    {"cuStreamGetFlags_ptsz", fp(&cuStreamGetFlags_ptsz)},
    {"cuStreamGetDevice", fp(&cuStreamGetDevice)},
    {"cuStreamGetDevice_ptsz", fp(&cuStreamGetDevice_ptsz)},
    {"cuStreamBeginCapture_v2", fp(&cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture_v2_ptsz", fp(&cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamEndCapture", fp(&cuStreamEndCapture)},
    {"cuStreamEndCapture_ptsz", fp(&cuStreamEndCapture_ptsz)},
    {"cuStreamIsCapturing", fp(&cuStreamIsCapturing)},
    {"cuStreamIsCapturing_ptsz", fp(&cuStreamIsCapturing_ptsz)},
    {"cuStreamGetCaptureInfo_v3", fp(&cuStreamGetCaptureInfo_v3)},
    {"cuStreamGetCaptureInfo_v3_ptsz", fp(&cuStreamGetCaptureInfo_v3_ptsz)},
    {"cuThreadExchangeStreamCaptureMode", fp(&cuThreadExchangeStreamCaptureMode)},
    {"cuGraphDestroy", fp(&cuGraphDestroy)},
    {"cuDeviceCanAccessPeer", fp(&cuDeviceCanAccessPeer)},
    {"cuCtxGetDevice", fp(&cuCtxGetDevice)},
    {"cuCtxGetDevice_v2", fp(&cuCtxGetDevice_v2)},
    {"cuCtxGetId", fp(&cuCtxGetId)},
    {"cuGetProcAddress_v2", fp(&cuGetProcAddress_v2)},
};

void* find_export(const char* name) noexcept {
  for (const Export& e : kExports) {
    if (std::strcmp(e.symbol, name) == 0) return e.fn;
  }
  size_t n = 0;
  const Export* legacy = legacy_exports(&n);
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(legacy[i].symbol, name) == 0) return legacy[i].fn;
  }
  return nullptr;
}

}  // namespace

CUresult proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) noexcept {
  if (pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* exported = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = sim_get_proc_symbol(symbol, &exported, cuda_version, flags, &st);
  if (r != CUDA_SUCCESS) return r;
  *pfn = exported != nullptr ? find_export(exported) : nullptr;
  if (exported != nullptr && *pfn == nullptr) st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (status != nullptr) *status = st;
  return CUDA_SUCCESS;
}

}  // namespace expanse::sim::exported

// ---- control ------------------------------------------------------------------------------------

EXPANSE_EXPORT int expanse_sim_configure(const char* conf) {
  using namespace expanse::sim::exported;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  try {
    sim::reset(sim::sim_config_from_string(conf != nullptr ? conf : ""));
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return 1;
  }
  g_configured.store(true, std::memory_order_release);
  t_last_error.clear();
  return 0;
}

EXPANSE_EXPORT const char* expanse_sim_last_error(void) {
  return expanse::sim::exported::t_last_error.c_str();
}

EXPANSE_EXPORT unsigned long long expanse_sim_call_count(const char* base_name) {
  ensure_configured();
  expanse::driver::EntryPoint e{};
  if (!expanse::sim::exported::entry_point_by_name(base_name, &e)) {
    expanse::sim::exported::t_last_error =
        std::string("not a driver entry point: ") + (base_name != nullptr ? base_name : "(null)");
    return 0;
  }
  return sim::call_count(e);
}

EXPANSE_EXPORT unsigned long long expanse_sim_total_calls(void) {
  ensure_configured();
  return sim::total_calls();
}

EXPANSE_EXPORT void expanse_sim_reset_counts(void) {
  ensure_configured();
  sim::reset_counts();
}

EXPANSE_EXPORT int expanse_sim_inject_failure(const char* base_name, unsigned long long nth,
                                              int code) {
  ensure_configured();
  expanse::driver::EntryPoint e{};
  if (!expanse::sim::exported::entry_point_by_name(base_name, &e)) {
    expanse::sim::exported::t_last_error =
        std::string("not a driver entry point: ") + (base_name != nullptr ? base_name : "(null)");
    return 1;
  }
  try {
    sim::inject_failure(e, nth, static_cast<CUresult>(code));
  } catch (const std::exception& ex) {
    expanse::sim::exported::t_last_error = ex.what();
    return 1;
  }
  return 0;
}

EXPANSE_EXPORT void expanse_sim_clear_injections(void) {
  ensure_configured();
  sim::clear_injections();
}

EXPANSE_EXPORT double expanse_sim_modeled_seconds(void) {
  ensure_configured();
  return sim::modeled_seconds();
}

EXPANSE_EXPORT void expanse_sim_hold_stream(void* stream) {
  ensure_configured();
  try {
    sim::hold_stream(static_cast<CUstream>(stream));
  } catch (const std::exception& e) {
    expanse::sim::exported::t_last_error = e.what();
  }
}

EXPANSE_EXPORT void expanse_sim_release_stream(void* stream) {
  ensure_configured();
  try {
    sim::release_stream(static_cast<CUstream>(stream));
  } catch (const std::exception& e) {
    expanse::sim::exported::t_last_error = e.what();
  }
}

EXPANSE_EXPORT void expanse_sim_release_all(void) {
  ensure_configured();
  sim::release_all();
}

EXPANSE_EXPORT unsigned long long expanse_sim_dead_handle_uses(void) {
  ensure_configured();
  return sim::dead_handle_uses();
}

EXPANSE_EXPORT unsigned long long expanse_sim_pending_events(void) {
  ensure_configured();
  return sim::pending_events();
}

EXPANSE_EXPORT int expanse_sim_outstanding(unsigned long long* reservations,
                                           unsigned long long* allocations,
                                           unsigned long long* mappings,
                                           unsigned long long* physical_bytes) {
  ensure_configured();
  const sim::Outstanding o = sim::outstanding();
  if (reservations != nullptr) *reservations = o.reservations;
  if (allocations != nullptr) *allocations = o.allocations;
  if (mappings != nullptr) *mappings = o.mappings;
  if (physical_bytes != nullptr) *physical_bytes = o.physical_bytes;
  return 0;
}

EXPANSE_EXPORT const char* expanse_sim_describe_outstanding(void) {
  ensure_configured();
  expanse::sim::exported::t_description = sim::describe_outstanding();
  return expanse::sim::exported::t_description.c_str();
}
