#include "api/errors.hpp"
#include "api/pool_registry.hpp"
#include "api/runtime.hpp"

#include <cstdio>
#include <string>

namespace expanse::api {
namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

std::string& last_error() {
  thread_local std::string message;
  return message;
}

// A default-pool block freed on a stream of a capture routed to a pool joins that pool.
// One lock acquisition on the way through: the size is checked inside deallocate(). Only when
// the pointer is not live on `device` are the other devices asked, to name the right one.
void free_on_device(void* ptr, size_t size, int device, CUstream stream) {
  Runtime& rt = Runtime::get();
  core::DeviceAllocator& a = rt.device(device);
  try {
    a.deallocate(ptr, stream, size, join_for_free(device, stream));
  } catch (const usage_error&) {
    for (int d = 0; d < rt.device_count(); ++d) {
      core::DeviceAllocator* other = rt.existing(d);
      if (d != device && other != nullptr && other->owns(ptr)) {
        throw usage_error("expanse: free of " + hex(ptr) + " on device " + std::to_string(device) +
                          ", but it was allocated on device " + std::to_string(d) +
                          "; nothing was changed");
      }
    }
    throw;
  }
}

core::DeviceAllocator& owner_of(void* ptr, const char* what) {
  Runtime& rt = Runtime::get();
  for (int d = 0; d < rt.device_count(); ++d) {
    core::DeviceAllocator* a = rt.existing(d);
    if (a != nullptr && a->owns(ptr)) return *a;
  }
  throw usage_error(std::string("expanse: ") + what + " of " + hex(ptr) +
                    ": not a live block on any device; nothing was changed");
}

}  // namespace expanse::api
