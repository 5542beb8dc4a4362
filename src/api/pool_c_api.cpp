// The C ABI of pools (expanse_pool_*): pools.hpp with every exception turned into a code.
#include "api/errors.hpp"
#include "api/pool_registry.hpp"
#include "expanse/expanse.h"

#include <string>

using expanse::api::guarded;

namespace {

CUstream to_cu(struct CUstream_st* s) { return reinterpret_cast<CUstream>(s); }

}  // namespace

extern "C" {

EXPANSE_C_API int expanse_pool_create(int device, expanse_pool_id* id) {
  if (id == nullptr) {
    expanse::api::last_error() = "expanse_pool_create: id must not be NULL";
    return EXPANSE_EINVAL;
  }
  *id = 0;
  return guarded([&] { *id = expanse::api::pool_create(device); });
}

EXPANSE_C_API int expanse_pool_create_registrable(int device, expanse_pool_id* id) {
  if (id == nullptr) {
    expanse::api::last_error() = "expanse_pool_create_registrable: id must not be NULL";
    return EXPANSE_EINVAL;
  }
  *id = 0;
  return guarded([&] { *id = expanse::api::pool_create(device, true); });
}

EXPANSE_C_API int expanse_pool_retain(expanse_pool_id id) {
  return guarded([&] { expanse::api::pool_retain(id); });
}

EXPANSE_C_API int expanse_pool_release(expanse_pool_id id) {
  return guarded([&] { expanse::api::pool_release(id); });
}

EXPANSE_C_API int expanse_pool_begin_capture(expanse_pool_id id, struct CUstream_st* stream) {
  return guarded([&] { (void)expanse::api::pool_begin_capture(id, to_cu(stream)); });
}

EXPANSE_C_API int expanse_pool_begin_thread(expanse_pool_id id) {
  return guarded([&] { (void)expanse::api::pool_begin_thread(id); });
}

EXPANSE_C_API int expanse_pool_begin_filter(expanse_pool_id id,
                                            int (*filter)(struct CUstream_st* stream, void* ctx),
                                            void* ctx) {
  return guarded([&] { (void)expanse::api::pool_begin_filter(id, filter, ctx); });
}

EXPANSE_C_API int expanse_pool_end(expanse_pool_id id) {
  return guarded([&] { expanse::api::pool_end(id); });
}

EXPANSE_C_API void* expanse_pool_malloc(expanse_pool_id id, size_t size,
                                        struct CUstream_st* stream) {
  void* out = nullptr;
  guarded([&] { out = expanse::api::pool_malloc(id, size, to_cu(stream)); });
  return out;
}

EXPANSE_C_API int expanse_pool_trim(expanse_pool_id id) {
  bool done = true;
  const int rc = guarded([&] { done = expanse::api::pool_trim(id); });
  if (rc != EXPANSE_OK || done) return rc;
  expanse::api::last_error() = "expanse_pool_trim: pool " + std::to_string(id) +
                               ": a capture is announced in its device's context, and only a "
                               "context synchronize proves its work done; nothing was given "
                               "back (try again after the capture ends)";
  return EXPANSE_EBUSY;
}

EXPANSE_C_API int expanse_pool_sleep(expanse_pool_id id, int mode, struct CUstream_st* stream) {
  bool done = true;
  const int rc = guarded([&] { done = expanse::api::pool_sleep(id, mode, to_cu(stream)); });
  if (rc != EXPANSE_OK || done) return rc;
  expanse::api::last_error() =
      "expanse_pool_sleep: pool " + std::to_string(id) +
      ": a capture is announced in its device's context or routed into the pool, and sleeping "
      "needs a context synchronize that would invalidate it; nothing was changed (try again "
      "after the capture ends)";
  return EXPANSE_EBUSY;
}

EXPANSE_C_API int expanse_pool_wake(expanse_pool_id id, struct CUstream_st* stream) {
  return guarded([&] { expanse::api::pool_wake(id, to_cu(stream)); });
}

EXPANSE_C_API int expanse_pool_is_asleep(expanse_pool_id id) {
  bool asleep = false;
  const int rc = guarded([&] { asleep = expanse::api::pool_is_asleep(id); });
  return rc != EXPANSE_OK ? -rc : (asleep ? 1 : 0);
}

EXPANSE_C_API int expanse_release_host_backup(int device) {
  return guarded([&] { (void)expanse::api::release_host_backup(device); });
}

EXPANSE_C_API int expanse_set_wake_hook(void (*hook)(expanse_pool_id id, void* ctx), void* ctx) {
  static_assert(sizeof(expanse_pool_id) == sizeof(uint64_t), "pool ids are 64-bit");
  return guarded([&] {
    expanse::api::set_wake_hook(reinterpret_cast<void (*)(uint64_t, void*)>(hook), ctx);
  });
}

EXPANSE_C_API int expanse_pool_of(const void* ptr, expanse_pool_id* out) {
  if (out == nullptr) {
    expanse::api::last_error() = "expanse_pool_of: out must not be NULL";
    return EXPANSE_EINVAL;
  }
  *out = 0;
  return guarded([&] { *out = expanse::api::pool_of(ptr, "expanse_pool_of"); });
}

EXPANSE_C_API int expanse_pool_get_stats(expanse_pool_id id, expanse_pool_stats* s) {
  return guarded([&] { expanse::api::fill_pool_stats(id, s); });
}

}  // extern "C"
