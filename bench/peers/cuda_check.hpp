// A CUDA runtime error as an exception naming the call (the benchmark reports it and goes on to
// the next allocator: each runs in its own process).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace expanse::peers {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

}  // namespace expanse::peers
