// expanse_host_*: pinned host memory (expanse.h, "Pinned host memory"; host_pools.hpp).
#define EXPANSE_NULL_STREAM_IS_LEGACY 1
#include "api/errors.hpp"
#include "core/base/format.hpp"
#include "api/host_pools.hpp"
#include "api/runtime.hpp"
#include "expanse/expanse.h"

#include <cstring>

using expanse::api::guarded;
using expanse::api::Runtime;

namespace {

CUstream to_cu(struct CUstream_st* s) { return reinterpret_cast<CUstream>(s); }

}  // namespace

extern "C" {

EXPANSE_C_API int expanse_host_malloc(void** out, size_t size, int numa_node,
                                      struct CUstream_st* stream) {
  if (out == nullptr) {
    expanse::api::last_error() = "expanse_host_malloc: out must not be NULL";
    return EXPANSE_EINVAL;
  }
  *out = nullptr;
  return guarded([&] { *out = Runtime::get().host().allocate(size, numa_node, to_cu(stream)); });
}

EXPANSE_C_API int expanse_host_free(void* ptr, struct CUstream_st* stream) {
  if (ptr == nullptr) return EXPANSE_OK;
  return guarded([&] { Runtime::get().host().free(ptr, to_cu(stream)); });
}

EXPANSE_C_API int expanse_host_free_after_device(void* ptr, int device, unsigned flags) {
  if (ptr == nullptr) return EXPANSE_OK;
  return guarded([&] {
    if ((flags & ~EXPANSE_HOST_EVERY_STREAM) != 0) {
      throw expanse::usage_error("expanse_host_free_after_device of " +
                                 expanse::core::hex(reinterpret_cast<uintptr_t>(ptr)) +
                                 ": unknown flags " + std::to_string(flags) +
                                 "; nothing was changed");
    }
    Runtime::get().host().free_after_device(ptr, device,
                                            (flags & EXPANSE_HOST_EVERY_STREAM) != 0);
  });
}

EXPANSE_C_API int expanse_host_block_of(const void* ptr, void** base, size_t* size) {
  if (base == nullptr || size == nullptr) {
    expanse::api::last_error() = "expanse_host_block_of: base and size must not be NULL";
    return EXPANSE_EINVAL;
  }
  *base = nullptr;
  *size = 0;
  bool found = false;
  const int rc = guarded([&] { found = Runtime::get().host().block_of(ptr, base, size); });
  if (rc != EXPANSE_OK) return rc;
  if (!found) {
    // Asked of every pointer a tensor library copies from: a fixed message, no exception.
    expanse::api::last_error() = "expanse_host_block_of: not in a live pinned host block";
    *base = nullptr;
    *size = 0;
    return EXPANSE_EINVAL;
  }
  return EXPANSE_OK;
}

EXPANSE_C_API int expanse_host_record_stream(void* ptr, struct CUstream_st* stream) {
  return guarded([&] { Runtime::get().host().record_stream(ptr, to_cu(stream)); });
}

EXPANSE_C_API int expanse_host_release_cached(void) {
  return guarded([&] { Runtime::get().host().release_cached(); });
}

EXPANSE_C_API int expanse_host_reset_peak_stats(void) {
  return guarded([&] { Runtime::get().host().reset_peak(); });
}

EXPANSE_C_API int expanse_host_set_limit(size_t bytes) {
  return guarded([&] { Runtime::get().host().set_limit(bytes); });
}

EXPANSE_C_API int expanse_host_get_stats(int numa_node, expanse_host_stats* out) {
  return guarded([&] {
    if (out == nullptr || out->struct_size < sizeof(size_t)) {
      throw expanse::usage_error("expanse_host_get_stats: out is NULL or its struct_size is "
                                 "not set");
    }
    if (numa_node < -1) {
      throw expanse::usage_error("expanse_host_get_stats: NUMA node " +
                                 std::to_string(numa_node) + " (0 or more, or -1 for all)");
    }
    const expanse::core::HostPoolStats s = Runtime::get().host().stats(numa_node);
    expanse_host_stats full{};
    full.struct_size = sizeof full;
    full.requested_bytes = s.requested_bytes;
    full.allocated_bytes = s.allocated_bytes;
    full.pinned_bytes = s.pinned_bytes;
    full.mapped_bytes = s.mapped_bytes;
    full.peak_pinned_bytes = s.peak_pinned_bytes;
    full.limit_bytes = s.limit_bytes;
    full.live_blocks = s.live_blocks;
    full.pending_blocks = s.pending_blocks;
    full.num_allocs = s.num_allocs;
    full.num_frees = s.num_frees;
    full.num_created_pages = s.num_created_pages;
    full.num_released_pages = s.num_released_pages;
    full.num_remapped_pages = s.num_remapped_pages;
    full.num_waits = s.num_waits;
    full.num_ooms = s.num_ooms;
    full.page_bytes = s.page_bytes;
    full.path = s.page_bytes == 0 ? 0 : static_cast<uint64_t>(s.path);
    // A shorter, older struct is written up to its own size.
    const size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t),
                reinterpret_cast<const char*>(&full) + sizeof(size_t), n - sizeof(size_t));
  });
}

}  // extern "C"
