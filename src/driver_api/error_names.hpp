// CUresult spellings and descriptions, as cuGetErrorName / cuGetErrorString answer them
// (CUDA 13.0 values). The sim answers from this table; the loader asks the driver it loaded.
#pragma once

#include <cuda.h>

namespace expanse::driver {

// "CUDA_ERROR_INVALID_VALUE", or nullptr for a value that is not a CUresult.
const char* error_name(int code) noexcept;
// "invalid argument", or nullptr for a value that is not a CUresult.
const char* error_string(int code) noexcept;

}  // namespace expanse::driver
