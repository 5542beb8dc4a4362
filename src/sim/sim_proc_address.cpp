// cuGetProcAddress (spec §1.3): base name + cudaVersion -> the newest ABI variant introduced at or
// before cudaVersion. Introduction versions are those of the PFN_*_v<version> typedefs of
// cudaTypedefs.h (CUDA 13.0).
#include "sim/sim_entry.hpp"
#include "sim/sim_internal.hpp"

#include <cstring>

namespace expanse::sim {
namespace {

struct Variant {
  const char* name;  // base name, as asked for
  int version;       // CUDA version that introduced this ABI variant
  bool per_thread;   // a _ptsz/_ptds variant (returned for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
  void* fn;
};

template <class F>
void* fp(F* f) noexcept {
  return reinterpret_cast<void*>(f);
}

const Variant* variants(size_t* n) {
  // Streams: the sim's per-thread default stream is its legacy default stream, so the _ptsz
  // variants are the same functions.
  static const Variant v[] = {
      {"cuGetErrorString", 6000, false, fp(&sim_get_error_string)},
      {"cuGetErrorName", 6000, false, fp(&sim_get_error_name)},
      {"cuInit", 2000, false, fp(&sim_init)},
      {"cuDriverGetVersion", 2020, false, fp(&sim_driver_get_version)},
      {"cuDeviceGet", 2000, false, fp(&sim_device_get)},
      {"cuDeviceGetCount", 2000, false, fp(&sim_device_get_count)},
      {"cuDeviceGetAttribute", 2000, false, fp(&sim_device_get_attribute)},
      {"cuDeviceGetName", 2000, false, fp(&sim_device_get_name)},
      {"cuDeviceTotalMem", 2000, false, fp(&sim_device_total_mem_v1)},
      {"cuDeviceTotalMem", 3020, false, fp(&sim_device_total_mem)},
      {"cuDevicePrimaryCtxRetain", 7000, false, fp(&sim_device_primary_ctx_retain)},
      {"cuDevicePrimaryCtxRelease", 7000, false, fp(&sim_device_primary_ctx_release)},
      {"cuDevicePrimaryCtxRelease", 11000, false, fp(&sim_device_primary_ctx_release)},
      {"cuCtxGetCurrent", 4000, false, fp(&sim_ctx_get_current)},
      {"cuCtxSetCurrent", 4000, false, fp(&sim_ctx_set_current)},
      {"cuCtxPushCurrent", 2000, false, fp(&sim_ctx_push_current)},
      {"cuCtxPushCurrent", 4000, false, fp(&sim_ctx_push_current)},
      {"cuCtxPopCurrent", 2000, false, fp(&sim_ctx_pop_current)},
      {"cuCtxPopCurrent", 4000, false, fp(&sim_ctx_pop_current)},
      {"cuCtxSynchronize", 2000, false, fp(&sim_ctx_synchronize)},
      {"cuCtxSynchronize", 13000, false, fp(&sim_ctx_synchronize_v2)},
      {"cuMemGetInfo", 2000, false, fp(&sim_mem_get_info_v1)},
      {"cuMemGetInfo", 3020, false, fp(&sim_mem_get_info)},
      {"cuMemAddressReserve", 10020, false, fp(&sim_mem_address_reserve)},
      {"cuMemAddressFree", 10020, false, fp(&sim_mem_address_free)},
      {"cuMemCreate", 10020, false, fp(&sim_mem_create)},
      {"cuMemRelease", 10020, false, fp(&sim_mem_release)},
      {"cuMemMap", 10020, false, fp(&sim_mem_map)},
      {"cuMemUnmap", 10020, false, fp(&sim_mem_unmap)},
      {"cuMemSetAccess", 10020, false, fp(&sim_mem_set_access)},
      {"cuMemGetAccess", 10020, false, fp(&sim_mem_get_access)},
      {"cuMemGetAllocationGranularity", 10020, false, fp(&sim_mem_get_allocation_granularity)},
      {"cuMemGetAllocationPropertiesFromHandle", 10020, false,
       fp(&sim_mem_get_allocation_properties_from_handle)},
      {"cuMemRetainAllocationHandle", 11000, false, fp(&sim_mem_retain_allocation_handle)},
      {"cuStreamCreate", 2000, false, fp(&sim_stream_create)},
      {"cuStreamDestroy", 2000, false, fp(&sim_stream_destroy)},
      {"cuStreamDestroy", 4000, false, fp(&sim_stream_destroy)},
      {"cuStreamSynchronize", 2000, false, fp(&sim_stream_synchronize)},
      {"cuStreamSynchronize", 7000, true, fp(&sim_stream_synchronize)},
      {"cuStreamQuery", 2000, false, fp(&sim_stream_query)},
      {"cuStreamQuery", 7000, true, fp(&sim_stream_query)},
      {"cuStreamWaitEvent", 3020, false, fp(&sim_stream_wait_event)},
      {"cuStreamWaitEvent", 7000, true, fp(&sim_stream_wait_event)},
      {"cuEventCreate", 2000, false, fp(&sim_event_create)},
      {"cuEventDestroy", 2000, false, fp(&sim_event_destroy)},
      {"cuEventDestroy", 4000, false, fp(&sim_event_destroy)},
      {"cuEventRecord", 2000, false, fp(&sim_event_record)},
      {"cuEventRecord", 7000, true, fp(&sim_event_record)},
      {"cuEventQuery", 2000, false, fp(&sim_event_query)},
      {"cuEventSynchronize", 2000, false, fp(&sim_event_synchronize)},
      {"cuGetProcAddress", 11030, false, fp(&sim_get_proc_address_v1)},
      {"cuGetProcAddress", 12000, false, fp(&sim_get_proc_address)},
  };
  *n = sizeof v / sizeof v[0];
  return v;
}

}  // namespace

CUresult sim_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
    known = true;
    if (v[i].version > cuda_version) continue;
    const Variant*& slot = v[i].per_thread ? best_pt : best;
    if (slot == nullptr || v[i].version > slot->version) slot = &v[i];
  }
  if (per_thread && best_pt != nullptr) best = best_pt;
  *pfn = best != nullptr ? best->fn : nullptr;
  if (status != nullptr) {
    *status = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
              : known         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

// The CUDA 11.3 ABI had no status argument and reported a missing symbol (or variant) as
// CUDA_ERROR_NOT_FOUND.
CUresult sim_get_proc_address_v1(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult r = sim_get_proc_address(symbol, pfn, cuda_version, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace expanse::sim
