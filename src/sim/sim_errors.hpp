// CUresult spellings and descriptions (internal to sim/).
#pragma once

#include <cuda.h>

namespace expanse::sim::detail {

// "CUDA_ERROR_INVALID_VALUE", or nullptr for a value that is not a CUresult.
const char* error_name(int code) noexcept;
// "invalid argument", or nullptr for a value that is not a CUresult.
const char* error_string(int code) noexcept;

}  // namespace expanse::sim::detail
