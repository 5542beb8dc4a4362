// Pools as the C ABI and the C++ API see them: process-wide ids, each naming one device's pool.
//
// An id comes from one process-wide counter (from 1; never reused) and names the pool of the same
// id in its device's allocator (core/pools/pool_table.hpp). The registry remembers which device each id
// belongs to, for the life of the runtime (an id released and forgotten by its allocator is still
// known here: its stats say returned). The operations below check here first (an id never
// created is an error naming it) and then ask the device's allocator, whose errors name the id
// too; on any error nothing was changed.
#pragma once

#include "api/pool_routes.hpp"
#include "core/device_allocator.hpp"
#include "core/pools/pool_table.hpp"
#include "expanse/expanse.h"

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace expanse::api {

class PoolRegistry {
 public:
  void add(core::PoolId id, int device);
  // The device of pool `id`. Throws usage_error naming `what` and the id for an id never
  // created (under this configuration).
  int device_of(core::PoolId id, const char* what) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<core::PoolId, int> devices_;
};

// The pool functions (expanse_pool_*), with exceptions. `what` names the caller in errors.
// registrable: every block its own exportable handle (expanse_pool_create_registrable).
core::PoolId pool_create(int device, bool registrable = false);
void pool_retain(core::PoolId id);
void pool_release(core::PoolId id);
// Each begin returns the route's token (PoolRoutes::end_route). begin_capture also announces a
// capture in the stream's context (core::CaptureAnnouncements), ended with the route.
uint64_t pool_begin_capture(core::PoolId id, CUstream stream);
uint64_t pool_begin_thread(core::PoolId id);
uint64_t pool_begin_filter(core::PoolId id, PoolFilter filter, void* ctx);
void pool_end(core::PoolId id);
// Ends the route `token` names (the C++ scopes); false if it had ended already.
bool pool_end_route(uint64_t token);
// Checks that `stream` belongs to the pool's device first.
void* pool_malloc(core::PoolId id, size_t size, CUstream stream);
// False when a capture is announced in the device's context: nothing was given back then.
bool pool_trim(core::PoolId id);
// Every field (struct_size = sizeof(expanse_pool_stats)).
expanse_pool_stats pool_stats(core::PoolId id);

// Shared by the pool functions: throws usage_error when `stream` belongs to another device than
// pool `id`'s; pool `id`'s allocator, after checking its use count is above 0 (*device: its
// device).
class Runtime;
void check_stream_device(Runtime& rt, core::PoolId id, int device, CUstream stream,
                         const char* what);
core::DeviceAllocator& live_pool(Runtime& rt, core::PoolId id, const char* what, int* device);

// Sleep and wake (sleep_c_api.cpp). pool_sleep returns false, with nothing changed, while a
// capture is announced in the device's context or routed into the pool.
bool pool_sleep(core::PoolId id, int mode, CUstream stream);
void pool_wake(core::PoolId id, CUstream stream);
bool pool_is_asleep(core::PoolId id);
size_t release_host_backup(int device);
void set_wake_hook(void (*hook)(uint64_t id, void* ctx), void* ctx);
// Fills out's first out->struct_size bytes, as fill_stats does.
void fill_pool_stats(core::PoolId id, expanse_pool_stats* out);

// The pool of the live block ptr (0: the default pool). Throws usage_error naming `what` for a
// pointer that is not a live block's start on any device.
core::PoolId pool_of(const void* ptr, const char* what);

// Allocation and free as the routes say (expanse_malloc, expanse_free, the torch pair, C++).
void* routed_allocate(size_t size, int device, CUstream stream);
// The pool a default-pool block freed on device/stream joins (0: none).
core::PoolId join_for_free(int device, CUstream stream);

}  // namespace expanse::api
