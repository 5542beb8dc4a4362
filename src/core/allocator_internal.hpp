// Pieces shared by the files that implement DeviceAllocator (device_allocator.cpp,
// page_supply.cpp, stream_order.cpp, allocator_introspection.cpp). Not a public header.
#pragma once

#include "core/device_allocator.hpp"

#include <cinttypes>
#include <cstdio>
#include <string>

namespace expanse::core {

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

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

// What one ensure_pages() call tried, for the OOM message.
struct DeviceAllocator::PageRequest {
  size_t bytes = 0;
  CUstream stream = nullptr;
  size_t needed = 0;
  size_t from_pool = 0;
  size_t reclaimed = 0;
  size_t created = 0;
  bool create_oom = false;
  bool limit_hit = false;
  bool waited = false;
  bool va_exhausted = false;
  bool hopeless = false;  // more pages than the device (or limit) has left: nothing was tried
};

}  // namespace expanse::core
