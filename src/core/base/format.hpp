// How the allocator's messages spell addresses and streams.
#pragma once

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

}  // namespace expanse::core
