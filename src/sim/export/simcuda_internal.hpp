// Shared by the translation units of libexpanse_simcuda.so.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace expanse::sim::exported {

struct Export {
  const char* symbol;
  void* fn;
};
// The legacy old-ABI functions defined in simcuda_legacy.cpp.
const Export* legacy_exports(size_t* n) noexcept;

// cuGetProcAddress_v2 of the library: the variant's exported function of this library.
CUresult proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) noexcept;

// Configures the library's sim from EXPANSE_CONF on first use, unless expanse_sim_configure()
// already did. A bad EXPANSE_CONF is reported on stderr and leaves a sim with no devices (cuInit
// then answers CUDA_ERROR_NO_DEVICE).
void ensure_configured() noexcept;

}  // namespace expanse::sim::exported
