// How the allocator's messages spell addresses, streams and driver results.
#pragma once

#include "driver_api/error_names.hpp"

#include <cuda.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace expanse::core {

inline std::string hex(CUdeviceptr p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, static_cast<uint64_t>(p));
  return buf;
}

inline std::string stream_name(CUstream s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", static_cast<void*>(s));
  return buf;
}

// A CUresult by its name ("CUDA_ERROR_INVALID_VALUE"), or its number where the name is unknown.
inline std::string code_name(CUresult r) {
  const char* n = driver::error_name(static_cast<int>(r));
  return n != nullptr ? n : "CUresult " + std::to_string(static_cast<int>(r));
}

}  // namespace expanse::core
