// cuGetProcAddress (spec §1.3): base name + cudaVersion -> the newest ABI variant introduced at or
// before cudaVersion. Introduction versions are those of the PFN_*_v<version> typedefs of
// cudaTypedefs.h (CUDA 13.0).
#include <cstring>

#include "sim/sim_entry.hpp"
#include "sim/sim_internal.hpp"

namespace expanse::sim {
namespace {

struct Variant {
  const char* name;    // base name, as asked for
  int version;         // CUDA version that introduced this ABI variant
  bool per_thread;     // a _ptsz/_ptds variant (returned for
                       // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
  void* fn;            // the in-process implementation
  const char* symbol;  // the symbol libcuda (and libexpanse_simcuda.so) exports for it
};

template <class F>
void* fp(F* f) noexcept {
  return reinterpret_cast<void*>(f);
}

const Variant* variants(size_t* n) {
  // The _ptsz variants treat the NULL stream as the calling thread's per-thread stream.
  static const Variant v[] = {
      {"cuGetErrorString", 6000, false, fp(&sim_get_error_string), "cuGetErrorString"},
      {"cuGetErrorName", 6000, false, fp(&sim_get_error_name), "cuGetErrorName"},
      {"cuInit", 2000, false, fp(&sim_init), "cuInit"},
      {"cuDriverGetVersion", 2020, false, fp(&sim_driver_get_version), "cuDriverGetVersion"},
      {"cuDeviceGet", 2000, false, fp(&sim_device_get), "cuDeviceGet"},
      {"cuDeviceGetCount", 2000, false, fp(&sim_device_get_count), "cuDeviceGetCount"},
      {"cuDeviceGetAttribute", 2000, false, fp(&sim_device_get_attribute), "cuDeviceGetAttribute"},
      {"cuDeviceGetName", 2000, false, fp(&sim_device_get_name), "cuDeviceGetName"},
      {"cuDeviceTotalMem", 2000, false, fp(&sim_device_total_mem_v1), "cuDeviceTotalMem"},
      {"cuDeviceTotalMem", 3020, false, fp(&sim_device_total_mem), "cuDeviceTotalMem_v2"},
      {"cuDevicePrimaryCtxRetain", 7000, false, fp(&sim_device_primary_ctx_retain),
       "cuDevicePrimaryCtxRetain"},
      {"cuDevicePrimaryCtxRelease", 7000, false, fp(&sim_device_primary_ctx_release),
       "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, false, fp(&sim_device_primary_ctx_release),
       "cuDevicePrimaryCtxRelease_v2"},
      {"cuCtxGetCurrent", 4000, false, fp(&sim_ctx_get_current), "cuCtxGetCurrent"},
      {"cuCtxSetCurrent", 4000, false, fp(&sim_ctx_set_current), "cuCtxSetCurrent"},
      {"cuCtxPushCurrent", 2000, false, fp(&sim_ctx_push_current), "cuCtxPushCurrent"},
      {"cuCtxPushCurrent", 4000, false, fp(&sim_ctx_push_current), "cuCtxPushCurrent_v2"},
      {"cuCtxPopCurrent", 2000, false, fp(&sim_ctx_pop_current), "cuCtxPopCurrent"},
      {"cuCtxPopCurrent", 4000, false, fp(&sim_ctx_pop_current), "cuCtxPopCurrent_v2"},
      {"cuCtxSynchronize", 2000, false, fp(&sim_ctx_synchronize), "cuCtxSynchronize"},
      {"cuCtxSynchronize", 13000, false, fp(&sim_ctx_synchronize_v2), "cuCtxSynchronize_v2"},
      {"cuMemGetInfo", 2000, false, fp(&sim_mem_get_info_v1), "cuMemGetInfo"},
      {"cuMemGetInfo", 3020, false, fp(&sim_mem_get_info), "cuMemGetInfo_v2"},
      {"cuMemAddressReserve", 10020, false, fp(&sim_mem_address_reserve), "cuMemAddressReserve"},
      {"cuMemAddressFree", 10020, false, fp(&sim_mem_address_free), "cuMemAddressFree"},
      {"cuMemCreate", 10020, false, fp(&sim_mem_create), "cuMemCreate"},
      {"cuMemRelease", 10020, false, fp(&sim_mem_release), "cuMemRelease"},
      {"cuMemMap", 10020, false, fp(&sim_mem_map), "cuMemMap"},
      {"cuMemUnmap", 10020, false, fp(&sim_mem_unmap), "cuMemUnmap"},
      {"cuMemSetAccess", 10020, false, fp(&sim_mem_set_access), "cuMemSetAccess"},
      {"cuMemGetAccess", 10020, false, fp(&sim_mem_get_access), "cuMemGetAccess"},
      {"cuMemGetAllocationGranularity", 10020, false, fp(&sim_mem_get_allocation_granularity),
       "cuMemGetAllocationGranularity"},
      {"cuMemGetAllocationPropertiesFromHandle", 10020, false,
       fp(&sim_mem_get_allocation_properties_from_handle),
       "cuMemGetAllocationPropertiesFromHandle"},
      {"cuMemRetainAllocationHandle", 11000, false, fp(&sim_mem_retain_allocation_handle),
       "cuMemRetainAllocationHandle"},
      {"cuStreamCreate", 2000, false, fp(&sim_stream_create), "cuStreamCreate"},
      {"cuStreamDestroy", 2000, false, fp(&sim_stream_destroy), "cuStreamDestroy"},
      {"cuStreamDestroy", 4000, false, fp(&sim_stream_destroy), "cuStreamDestroy_v2"},
      {"cuStreamSynchronize", 2000, false, fp(&sim_stream_synchronize), "cuStreamSynchronize"},
      {"cuStreamSynchronize", 7000, true, fp(&sim_stream_synchronize_ptsz),
       "cuStreamSynchronize_ptsz"},
      {"cuStreamQuery", 2000, false, fp(&sim_stream_query), "cuStreamQuery"},
      {"cuStreamQuery", 7000, true, fp(&sim_stream_query_ptsz), "cuStreamQuery_ptsz"},
      {"cuStreamWaitEvent", 3020, false, fp(&sim_stream_wait_event), "cuStreamWaitEvent"},
      {"cuStreamWaitEvent", 7000, true, fp(&sim_stream_wait_event_ptsz),
       "cuStreamWaitEvent_ptsz"},
      {"cuEventCreate", 2000, false, fp(&sim_event_create), "cuEventCreate"},
      {"cuEventDestroy", 2000, false, fp(&sim_event_destroy), "cuEventDestroy"},
      {"cuEventDestroy", 4000, false, fp(&sim_event_destroy), "cuEventDestroy_v2"},
      {"cuEventRecord", 2000, false, fp(&sim_event_record), "cuEventRecord"},
      {"cuEventRecord", 7000, true, fp(&sim_event_record_ptsz), "cuEventRecord_ptsz"},
      {"cuEventQuery", 2000, false, fp(&sim_event_query), "cuEventQuery"},
      {"cuEventSynchronize", 2000, false, fp(&sim_event_synchronize), "cuEventSynchronize"},
      {"cuMemcpyHtoD", 3020, false, fp(&sim_memcpy_htod), "cuMemcpyHtoD_v2"},
      {"cuMemcpyDtoH", 3020, false, fp(&sim_memcpy_dtoh), "cuMemcpyDtoH_v2"},
      {"cuStreamGetCtx", 9020, false, fp(&sim_stream_get_ctx), "cuStreamGetCtx"},
      {"cuStreamGetCtx", 9020, true, fp(&sim_stream_get_ctx_ptsz), "cuStreamGetCtx_ptsz"},
      {"cuStreamGetCtx", 12050, false, fp(&sim_stream_get_ctx_v2), "cuStreamGetCtx_v2"},
      {"cuStreamGetCtx", 12050, true, fp(&sim_stream_get_ctx_v2_ptsz), "cuStreamGetCtx_v2_ptsz"},
      {"cuStreamGetId", 12000, false, fp(&sim_stream_get_id), "cuStreamGetId"},
      {"cuStreamGetId", 12000, true, fp(&sim_stream_get_id_ptsz), "cuStreamGetId_ptsz"},
      {"cuStreamGetFlags", 5050, false, fp(&sim_stream_get_flags), "cuStreamGetFlags"},
      {"cuStreamGetFlags", 7000, true, fp(&sim_stream_get_flags_ptsz), "cuStreamGetFlags_ptsz"},
      {"cuStreamGetDevice", 12080, false, fp(&sim_stream_get_device), "cuStreamGetDevice"},
      {"cuStreamGetDevice", 12080, true, fp(&sim_stream_get_device_ptsz),
       "cuStreamGetDevice_ptsz"},
      {"cuStreamBeginCapture", 10000, false, fp(&sim_stream_begin_capture_v1),
       "cuStreamBeginCapture"},
      {"cuStreamBeginCapture", 10000, true, fp(&sim_stream_begin_capture_v1_ptsz),
       "cuStreamBeginCapture_ptsz"},
      {"cuStreamBeginCapture", 10010, false, fp(&sim_stream_begin_capture),
       "cuStreamBeginCapture_v2"},
      {"cuStreamBeginCapture", 10010, true, fp(&sim_stream_begin_capture_ptsz),
       "cuStreamBeginCapture_v2_ptsz"},
      {"cuStreamEndCapture", 10000, false, fp(&sim_stream_end_capture), "cuStreamEndCapture"},
      {"cuStreamEndCapture", 10000, true, fp(&sim_stream_end_capture_ptsz),
       "cuStreamEndCapture_ptsz"},
      {"cuStreamIsCapturing", 10000, false, fp(&sim_stream_is_capturing), "cuStreamIsCapturing"},
      {"cuStreamIsCapturing", 10000, true, fp(&sim_stream_is_capturing_ptsz),
       "cuStreamIsCapturing_ptsz"},
      {"cuStreamGetCaptureInfo", 10010, false, fp(&sim_stream_get_capture_info_v1),
       "cuStreamGetCaptureInfo"},
      {"cuStreamGetCaptureInfo", 10010, true, fp(&sim_stream_get_capture_info_v1_ptsz),
       "cuStreamGetCaptureInfo_ptsz"},
      {"cuStreamGetCaptureInfo", 11030, false, fp(&sim_stream_get_capture_info_v2),
       "cuStreamGetCaptureInfo_v2"},
      {"cuStreamGetCaptureInfo", 11030, true, fp(&sim_stream_get_capture_info_v2_ptsz),
       "cuStreamGetCaptureInfo_v2_ptsz"},
      {"cuStreamGetCaptureInfo", 12030, false, fp(&sim_stream_get_capture_info),
       "cuStreamGetCaptureInfo_v3"},
      {"cuStreamGetCaptureInfo", 12030, true, fp(&sim_stream_get_capture_info_ptsz),
       "cuStreamGetCaptureInfo_v3_ptsz"},
      {"cuThreadExchangeStreamCaptureMode", 10010, false,
       fp(&sim_thread_exchange_stream_capture_mode), "cuThreadExchangeStreamCaptureMode"},
      {"cuGraphDestroy", 10000, false, fp(&sim_graph_destroy), "cuGraphDestroy"},
      {"cuDeviceCanAccessPeer", 4000, false, fp(&sim_device_can_access_peer),
       "cuDeviceCanAccessPeer"},
      {"cuCtxGetDevice", 2000, false, fp(&sim_ctx_get_device), "cuCtxGetDevice"},
      {"cuCtxGetDevice", 13000, false, fp(&sim_ctx_get_device_v2), "cuCtxGetDevice_v2"},
      {"cuCtxGetId", 12000, false, fp(&sim_ctx_get_id), "cuCtxGetId"},
      {"cuGetProcAddress", 11030, false, fp(&sim_get_proc_address_v1), "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, false, fp(&sim_get_proc_address), "cuGetProcAddress_v2"},
  };
  *n = sizeof v / sizeof v[0];
  return v;
}

// The variant cuGetProcAddress_v2 returns (nullptr with *status saying why), or an error code.
CUresult lookup(const char* symbol, int cuda_version, cuuint64_t flags, const Variant** out,
                CUdriverProcAddressQueryResult* status) {
  *out = nullptr;
  if (symbol == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  int driver_version = 0;
  {
    std::lock_guard<std::mutex> lock(detail::state_mutex());
    driver_version = detail::state_locked().cfg.driver_version;
  }
  if (cuda_version > driver_version) return CUDA_ERROR_INVALID_VALUE;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  size_t n = 0;
  const Variant* v = variants(&n);
  bool known = false;
  const Variant* best = nullptr;
  const Variant* best_pt = nullptr;
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(v[i].name, symbol) != 0) continue;
    // A driver of driver_version knows nothing of variants introduced after it.
    if (v[i].version > driver_version) continue;
    known = true;
    if (v[i].version > cuda_version) continue;
    const Variant*& slot = v[i].per_thread ? best_pt : best;
    if (slot == nullptr || v[i].version > slot->version) slot = &v[i];
  }
  if (per_thread && best_pt != nullptr) best = best_pt;
  *out = best;
  *status = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
            : known         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult sim_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) {
  if (pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Variant* v = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = lookup(symbol, cuda_version, flags, &v, &st);
  if (r != CUDA_SUCCESS) return r;
  *pfn = v != nullptr ? v->fn : nullptr;
  if (status != nullptr) *status = st;
  return CUDA_SUCCESS;
}

CUresult sim_get_proc_symbol(const char* symbol, const char** exported, int cuda_version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  if (exported == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Variant* v = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = lookup(symbol, cuda_version, flags, &v, &st);
  if (r != CUDA_SUCCESS) return r;
  *exported = v != nullptr ? v->symbol : nullptr;
  if (status != nullptr) *status = st;
  return CUDA_SUCCESS;
}

// The CUDA 11.3 ABI had no status argument and reported a missing symbol (or variant) as
// CUDA_ERROR_NOT_FOUND.
CUresult sim_get_proc_address_v1(const char* symbol, void** pfn, int cuda_version,
                                 cuuint64_t flags) {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult r = sim_get_proc_address(symbol, pfn, cuda_version, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace expanse::sim
