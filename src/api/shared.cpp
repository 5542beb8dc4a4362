#include "api/errors.hpp"
#include "api/runtime.hpp"
#include "api/torch_entry.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>

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

// One lock acquisition on the way through: the size is checked inside deallocate(). Only when
// the pointer is not live on `device` are the other devices asked, to name the right one.
void free_on_device(void* ptr, size_t size, int device, CUstream stream) {
  Runtime& rt = Runtime::get();
  core::DeviceAllocator& a = rt.device(device);
  try {
    a.deallocate(ptr, stream, size);
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

void fill_stats(int device, expanse_stats* out) {
  if (out == nullptr) throw usage_error("expanse_get_stats: out is NULL");
  if (out->struct_size < sizeof(size_t)) {
    throw usage_error("expanse_get_stats: struct_size " + std::to_string(out->struct_size) +
                      " is too small; set it to sizeof(expanse_stats)");
  }
  core::DeviceAllocator& a = Runtime::get().device(device);
  core::DeviceStats s = a.stats();
  expanse_stats full{};
  full.struct_size = sizeof(expanse_stats);
  full.requested_bytes = s.requested_bytes;
  full.allocated_bytes = s.allocated_bytes;
  full.touched_bytes = s.touched_bytes;
  full.mapped_bytes = s.mapped_bytes;
  full.cached_bytes = s.cached_bytes;
  full.pooled_bytes = s.pooled_bytes;
  full.physical_bytes = s.physical_bytes;
  full.va_reserved_bytes = s.va_reserved_bytes;
  full.peak_requested_bytes = s.peak_requested_bytes;
  full.peak_allocated_bytes = s.peak_allocated_bytes;
  full.peak_mapped_bytes = s.peak_mapped_bytes;
  full.peak_physical_bytes = s.peak_physical_bytes;
  full.peak_va_reserved_bytes = s.peak_va_reserved_bytes;
  full.live_blocks = s.live_blocks;
  full.num_allocs = s.num_allocs;
  full.num_frees = s.num_frees;
  full.num_ooms = s.num_ooms;
  full.num_reclaimed_pages = s.num_reclaimed_pages;
  full.num_created_pages = s.num_created_pages;
  full.num_released_pages = s.num_released_pages;
  full.driver_calls_total = s.total_driver_calls();
  full.modeled_driver_seconds = s.modeled_driver_ns * 1e-9;
  full.page_size = a.page_size();
  full.capacity_bytes = a.capacity();
  size_t lim = a.limit();
  full.limit_bytes = lim == core::kNoLimit ? UINT64_MAX : lim;
  static_assert(driver::kEntryPointCount <= EXPANSE_MAX_ENTRY_POINTS);
  full.num_entry_points = static_cast<uint32_t>(driver::kEntryPointCount);
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    full.driver_calls[i] = s.driver_calls[static_cast<size_t>(i)];
  }
  const TorchFreeCounts tc = torch_free_counts(device);
  full.num_free_size_mismatches = tc.size_mismatches;
  full.num_unknown_frees = tc.unknown;
  size_t n = out->struct_size < sizeof(expanse_stats) ? out->struct_size : sizeof(expanse_stats);
  size_t caller_size = out->struct_size;
  std::memcpy(out, &full, n);
  out->struct_size = caller_size < sizeof(expanse_stats) ? caller_size : sizeof(expanse_stats);
}

}  // namespace expanse::api
