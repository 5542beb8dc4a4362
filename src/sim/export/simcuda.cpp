// libexpanse_simcuda.so: the sim under the symbol names a CUDA 13 client links against (cuda.h's
// #defines turn e.g. cuMemGetInfo into cuMemGetInfo_v2), the other ABI variants the sim
// implements (the legacy old-ABI names, _ptsz), and cuGetProcAddress. All are generated from
// the entry-point list and the sim's list of other variants (sim_entry.hpp); the C control
// functions of expanse_sim_control.h are in simcuda_control.cpp.
#include <cuda.h>

#include <cstring>

#include "sim/export/simcuda_internal.hpp"
#include "sim/sim_entry.hpp"

namespace expanse::sim::exported {
namespace {

// cuGetProcAddress_v2 of the library: the variant's exported function of this library.
CUresult proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) noexcept;

// The CUDA 11.3 ABI: no status argument; a missing symbol or variant is CUDA_ERROR_NOT_FOUND.
CUresult proc_address_v1(const char* symbol, void** pfn, int cuda_version,
                         cuuint64_t flags) noexcept {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult r = proc_address(symbol, pfn, cuda_version, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// Defines the exported function whose symbol is `name` (an assembler name, so that neither
// cuda.h's #defines of the legacy names nor its declarations of the current ones apply), which
// configures the library on first use and forwards to impl.
#define EXPANSE_EXPORT_AS(function, name, impl, params, args)                           \
  __attribute__((visibility("default"))) CUresult function params __asm__(name);       \
  CUresult function params {                                                          \
    ensure_configured();                                                              \
    return impl args;                                                                 \
  }

#define EXPANSE_X(field, base, symbol, version, need, params, args) \
  EXPANSE_EXPORT_AS(export_##symbol, #symbol, sim_##field, params, args)
EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X

#define EXPANSE_X(base, version, per_thread, impl, symbol, params, args) \
  EXPANSE_EXPORT_AS(export_##symbol, #symbol, impl, params, args)
EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X

EXPANSE_EXPORT_AS(export_cuGetProcAddress_v2, "cuGetProcAddress_v2", proc_address,
                  (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                   CUdriverProcAddressQueryResult* status),
                  (symbol, pfn, cudaVersion, flags, status))
EXPANSE_EXPORT_AS(export_cuGetProcAddress, "cuGetProcAddress", proc_address_v1,
                  (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags),
                  (symbol, pfn, cudaVersion, flags))
#undef EXPANSE_EXPORT_AS

// ---- cuGetProcAddress answers with this library's exported functions ----------------------------

namespace {

struct Export {
  const char* symbol;
  void* fn;
};

template <class F>
void* fp(F* f) noexcept {
  return reinterpret_cast<void*>(f);
}

const Export kExports[] = {
#define EXPANSE_X(field, base, symbol, ...) {#symbol, fp(&export_##symbol)},
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
#define EXPANSE_X(base, version, per_thread, impl, symbol, ...) {#symbol, fp(&export_##symbol)},
    EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X
    {"cuGetProcAddress_v2", fp(&export_cuGetProcAddress_v2)},
    {"cuGetProcAddress", fp(&export_cuGetProcAddress)},
};

void* find_export(const char* name) noexcept {
  for (const Export& e : kExports) {
    if (std::strcmp(e.symbol, name) == 0) return e.fn;
  }
  return nullptr;
}

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

}  // namespace
}  // namespace expanse::sim::exported
