#include "api/pool_registry.hpp"

#include "api/fork_guard.hpp"
#include "api/runtime.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

namespace expanse::api {
namespace {

std::atomic<core::PoolId> g_next_id{1};

std::string stream_text(CUstream s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", static_cast<void*>(s));
  return buf;
}

std::string pool_text(core::PoolId id, int device) {
  return "pool " + std::to_string(id) + " (device " + std::to_string(device) + ")";
}

// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the calling thread's stream of its current
// context (with none current, expanse uses the device's primary context).
bool special_stream(CUstream s) { return reinterpret_cast<uintptr_t>(s) <= 2; }

// The ordinal of the device `stream` belongs to, or -1 when the driver cannot tell (a special
// handle with no current context). Throws driver_failure naming `what` and the stream when the
// driver rejects a created stream.
int stream_device(const driver::LoadedDriver& d, CUstream stream, const char* what) {
  const driver::DriverTable& t = d.table();
  CUdevice dev = -1;
  CUresult r = CUDA_SUCCESS;
  driver::EntryPoint failed = driver::EntryPoint::stream_get_device;
  if (d.has(driver::EntryPoint::stream_get_device)) {
    r = t.stream_get_device(stream, &dev);
  } else {
    CUcontext ctx = nullptr;
    failed = driver::EntryPoint::stream_get_ctx;
    r = t.stream_get_ctx(stream, &ctx);
    if (r == CUDA_SUCCESS) {
      failed = driver::EntryPoint::ctx_push_current;
      r = t.ctx_push_current(ctx);
      if (r == CUDA_SUCCESS) {
        failed = driver::EntryPoint::ctx_get_device;
        r = t.ctx_get_device(&dev);
        CUcontext popped = nullptr;
        t.ctx_pop_current(&popped);
      }
    }
  }
  if (r == CUDA_SUCCESS) {
    // A CUdevice is a handle, not an ordinal (the sim's are not): find its ordinal.
    int n = 0;
    if (t.device_get_count(&n) == CUDA_SUCCESS) {
      for (int i = 0; i < n; ++i) {
        CUdevice di = -1;
        if (t.device_get(&di, i) == CUDA_SUCCESS && di == dev) return i;
      }
    }
    return -1;  // cannot tell: the allocator's own checks apply
  }
  if (special_stream(stream)) return -1;
  throw driver_failure(std::string(what) + ": cannot tell the device of stream " +
                           stream_text(stream) + " (" + d.describe_error(failed, r) +
                           "); nothing was changed",
                       static_cast<int>(r));
}

// The context a capture on s belongs to (the calling thread's current one for special handles).
CUcontext capture_context(const driver::LoadedDriver& d, CUstream s, const char* what) {
  CUcontext ctx = nullptr;
  const CUresult r = d.table().stream_get_ctx(s, &ctx);
  if (r != CUDA_SUCCESS || ctx == nullptr) {
    throw driver_failure(std::string(what) + ": cannot tell the context of stream " +
                             stream_text(s) + " (" +
                             d.describe_error(driver::EntryPoint::stream_get_ctx, r) +
                             "); a NULL or per-thread stream needs a current context",
                         static_cast<int>(r));
  }
  return ctx;
}

}  // namespace

// Throws usage_error when `stream` belongs to another device than pool `id`'s.
void check_stream_device(Runtime& rt, core::PoolId id, int device, CUstream stream,
                         const char* what) {
  const int sd = stream_device(rt.driver(), stream, what);
  if (sd < 0 || sd == device) return;
  throw usage_error(std::string(what) + ": " + pool_text(id, device) + " is on device " +
                    std::to_string(device) + ", but stream " + stream_text(stream) +
                    " belongs to device " + std::to_string(sd) + "; nothing was changed");
}

// Pool `id`'s allocator, its use count checked above 0 when need_live.
core::DeviceAllocator& live_pool(Runtime& rt, core::PoolId id, const char* what, int* device) {
  *device = rt.pools().device_of(id, what);
  core::DeviceAllocator& a = rt.device(*device);
  // pool_stats throws (naming the id) for a pool released and forgotten.
  const core::PoolStats s = a.pool_stats(id);
  if (s.use_count <= 0) {
    throw usage_error(std::string(what) + ": " + pool_text(id, *device) +
                      " was released (its use count reached 0); nothing was changed");
  }
  return a;
}


void PoolRegistry::add(core::PoolId id, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  devices_[id] = device;
}

int PoolRegistry::device_of(core::PoolId id, const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(id);
  if (it == devices_.end()) {
    throw usage_error(std::string(what) + ": " +
                      (id == 0 ? std::string("pool id 0 is never a pool")
                               : "pool " + std::to_string(id) +
                                     " does not exist (ids come from expanse_pool_create)") +
                      "; nothing was changed");
  }
  return it->second;
}

core::PoolId pool_create(int device, bool registrable) {
  Runtime& rt = Runtime::get();
  core::DeviceAllocator& a = rt.device(device);
  const core::PoolId id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  a.create_pool(id, registrable);
  rt.pools().add(id, device);
  return id;
}

void pool_retain(core::PoolId id) {
  Runtime& rt = Runtime::get();
  rt.device(rt.pools().device_of(id, "expanse_pool_retain")).retain_pool(id);
}

void pool_release(core::PoolId id) {
  Runtime& rt = Runtime::get();
  rt.device(rt.pools().device_of(id, "expanse_pool_release")).release_pool(id);
}

uint64_t pool_begin_capture(core::PoolId id, CUstream stream) {
  const char* what = "expanse_pool_begin_capture";
  Runtime& rt = Runtime::get();
  int device = 0;
  (void)live_pool(rt, id, what, &device);
  check_stream_device(rt, id, device, stream, what);
  const CUcontext ctx = capture_context(rt.driver(), stream, what);
  // Announced before the route exists: the allocator never synchronizes ctx from here on.
  core::CaptureAnnouncements::begin(ctx, stream);
  try {
    return rt.routes().begin_capture(id, device, stream, ctx);
  } catch (...) {
    if (!core::CaptureAnnouncements::end_stream(stream)) core::CaptureAnnouncements::end(ctx);
    throw;
  }
}

uint64_t pool_begin_thread(core::PoolId id) {
  Runtime& rt = Runtime::get();
  int device = 0;
  (void)live_pool(rt, id, "expanse_pool_begin_thread", &device);
  return rt.routes().begin_thread(id, device);
}

uint64_t pool_begin_filter(core::PoolId id, PoolFilter filter, void* ctx) {
  Runtime& rt = Runtime::get();
  int device = 0;
  (void)live_pool(rt, id, "expanse_pool_begin_filter", &device);
  return rt.routes().begin_filter(id, device, filter, ctx);
}

void pool_end(core::PoolId id) {
  Runtime& rt = Runtime::get();
  (void)rt.pools().device_of(id, "expanse_pool_end");
  if (CUstream s = rt.routes().end(id, "expanse_pool_end")) rt.capture_ended(s);
}

bool pool_end_route(uint64_t token) {
  if (in_forked_child()) return false;  // a scope ending in a forked child touches nothing
  Runtime* rt = Runtime::current();
  CUstream capture = nullptr;
  if (rt == nullptr || !rt->routes().end_route(token, &capture)) return false;
  if (capture != nullptr) rt->capture_ended(capture);
  return true;
}

void* pool_malloc(core::PoolId id, size_t size, CUstream stream) {
  const char* what = "expanse_pool_malloc";
  Runtime& rt = Runtime::get();
  const int device = rt.pools().device_of(id, what);
  check_stream_device(rt, id, device, stream, what);
  core::DeviceAllocator& a = rt.device(device);
  return a.allocate(size, stream, id);
}

bool pool_trim(core::PoolId id) {
  Runtime& rt = Runtime::get();
  core::DeviceAllocator& a = rt.device(rt.pools().device_of(id, "expanse_pool_trim"));
  if (!a.has_pool(id)) return true;  // released, returned and forgotten: nothing is left
  return a.trim_pool(id);
}

expanse_pool_stats pool_stats(core::PoolId id) {
  Runtime& rt = Runtime::get();
  const int device = rt.pools().device_of(id, "expanse_pool_get_stats");
  core::DeviceAllocator& a = rt.device(device);
  expanse_pool_stats out{};
  out.struct_size = sizeof(expanse_pool_stats);
  out.id = id;
  out.device = device;
  if (!a.has_pool(id)) {
    // Released, its memory returned, its last block freed: the allocator forgot it.
    out.released = 1;
    out.returned = 1;
    return out;
  }
  const core::PoolStats s = a.pool_stats(id);
  out.use_count = s.use_count;
  out.released = s.use_count <= 0 ? 1 : 0;
  out.returned = s.returned ? 1 : 0;
  out.live_blocks = s.live_blocks;
  out.requested_bytes = s.requested_bytes;
  out.live_bytes = s.live_bytes;
  out.cached_bytes = s.cached_bytes;
  out.physical_bytes = s.physical_bytes;
  out.asleep = s.asleep ? 1 : 0;
  out.host_backup_bytes = s.host_backup_bytes;
  out.sleeps = s.cycles.sleeps;
  out.released_bytes = s.cycles.released_bytes;
  out.sleep_ns = s.cycles.sleep_wall_ns;
  out.wake_ns = s.cycles.wake_wall_ns;
  out.sleep_modeled_ns = static_cast<uint64_t>(s.cycles.sleep_modeled_ns);
  out.wake_modeled_ns = static_cast<uint64_t>(s.cycles.wake_modeled_ns);
  return out;
}

void fill_pool_stats(core::PoolId id, expanse_pool_stats* out) {
  if (out == nullptr) {
    throw usage_error("expanse_pool_get_stats: pool " + std::to_string(id) + ": s is NULL");
  }
  if (out->struct_size < sizeof(size_t)) {
    throw usage_error("expanse_pool_get_stats: pool " + std::to_string(id) + ": struct_size " +
                      std::to_string(out->struct_size) +
                      " is too small; set it to sizeof(expanse_pool_stats)");
  }
  const expanse_pool_stats full = pool_stats(id);
  const size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
  std::memcpy(out, &full, n);
  out->struct_size = n;
}

void* routed_allocate(size_t size, int device, CUstream stream) {
  Runtime& rt = Runtime::get();
  const core::PoolId pool = rt.routes().route(device, stream);
  core::DeviceAllocator& a = rt.device(device);
  return a.allocate(size, stream, pool);
}

core::PoolId pool_of(const void* ptr, const char* what) {
  Runtime& rt = Runtime::get();
  for (int d = 0; d < rt.device_count(); ++d) {
    core::DeviceAllocator* a = rt.existing(d);
    if (a != nullptr && a->owns(ptr)) return a->pool_of(ptr);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", ptr);
  throw usage_error(std::string(what) + ": " + buf +
                    " is not the start of a live block on any device");
}

core::PoolId join_for_free(int device, CUstream stream) {
  Runtime* rt = Runtime::current();
  return rt == nullptr ? 0 : rt->routes().join_for_free(device, stream);
}

}  // namespace expanse::api
