// cuGetProcAddress: base name + cudaVersion -> the newest ABI variant introduced at or before
// cudaVersion, among the listed entry points (driver_api/entry_points.hpp) and the sim's other
// variants (sim_entry.hpp). Introduction versions are those of the PFN_*_v<version> typedefs of
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
  static const Variant v[] = {
#define EXPANSE_X(field, base, symbol, version, need, ...) \
  {base, version, false, fp(&sim_##field), #symbol},
      EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
#define EXPANSE_X(base, version, per_thread, impl, symbol, ...) \
  {base, version, per_thread, fp(&impl), #symbol},
      EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X
      // cuGetProcAddress itself: an entry point of no list (the loader uses it to fill one).
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

// lookup, answering with what `field` holds of the chosen variant (nullptr for none).
template <class T>
CUresult answer(const char* symbol, T Variant::*field, T* out, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Variant* v = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = lookup(symbol, cuda_version, flags, &v, &st);
  if (r != CUDA_SUCCESS) return r;
  *out = v != nullptr ? v->*field : nullptr;
  if (status != nullptr) *status = st;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult sim_get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) {
  return answer(symbol, &Variant::fn, pfn, cuda_version, flags, status);
}

CUresult sim_get_proc_symbol(const char* symbol, const char** exported, int cuda_version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  return answer(symbol, &Variant::symbol, exported, cuda_version, flags, status);
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
