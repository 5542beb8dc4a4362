#include "api/pool_routes.hpp"

#include "core/front/cache_bypass.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <string>

namespace expanse::api {

PoolRoutes::~PoolRoutes() {
  for (const auto& r : routes_) {
    finish(*r);
    core::CacheBypass::leave();
  }
}

std::shared_ptr<PoolRoutes::Route> PoolRoutes::route(core::PoolId pool, int device, Kind kind) {
  auto r = std::make_shared<Route>();
  r->pool = pool;
  r->device = device;
  r->kind = kind;
  return r;
}

uint64_t PoolRoutes::add(std::shared_ptr<Route> r) {
  std::lock_guard<std::mutex> lock(mu_);
  r->token = next_token_++;
  // While any route exists, thread caches are bypassed: a routed allocation must come from its
  // pool, and a free on a routed capture's stream joins the pool (nothing enters a cache).
  core::CacheBypass::enter();
  routes_.push_back(r);
  count_.store(static_cast<int>(routes_.size()), std::memory_order_relaxed);
  return r->token;
}

uint64_t PoolRoutes::begin_capture(core::PoolId pool, int device, CUstream stream,
                                   CUcontext announced_ctx) {
  auto r = route(pool, device, Kind::capture);
  r->stream = stream;
  r->announced = announced_ctx;
  r->special = reinterpret_cast<uintptr_t>(stream) <= 2;  // NULL, LEGACY, PER_THREAD
  r->thread = std::this_thread::get_id();
  // Already capturing (begun before the route): its id now, while the stream surely exists.
  const Capture c = capture_of(stream);
  if (c.capturing) r->capture_id.store(c.id, std::memory_order_relaxed);
  return add(std::move(r));
}

uint64_t PoolRoutes::begin_thread(core::PoolId pool, int device) {
  auto r = route(pool, device, Kind::thread);
  r->thread = std::this_thread::get_id();
  return add(std::move(r));
}

uint64_t PoolRoutes::begin_filter(core::PoolId pool, int device, PoolFilter filter, void* ctx) {
  if (filter == nullptr) {
    throw usage_error("expanse_pool_begin_filter: pool " + std::to_string(pool) +
                      ": the filter is NULL; nothing was changed");
  }
  auto r = route(pool, device, Kind::filter);
  r->filter = filter;
  r->filter_ctx = ctx;
  return add(std::move(r));
}

void PoolRoutes::finish(const Route& r) {
  // The announcement begun with this stream (no driver call: the stream may be gone by now).
  if (r.kind == Kind::capture && r.announced != nullptr) {
    if (!core::CaptureAnnouncements::end_stream(r.stream)) {
      core::CaptureAnnouncements::end(r.announced);
    }
  }
}

CUstream PoolRoutes::end(core::PoolId pool, const char* what) {
  std::shared_ptr<Route> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if ((*it)->pool == pool) {
        gone = *it;
        routes_.erase(std::next(it).base());
        break;
      }
    }
    count_.store(static_cast<int>(routes_.size()), std::memory_order_relaxed);
  }
  if (!gone) {
    throw usage_error(std::string(what) + ": pool " + std::to_string(pool) +
                      " routes nothing (no begin, or every begin has ended); nothing was changed");
  }
  wait_for_calls(*gone);
  finish(*gone);
  core::CacheBypass::leave();
  return gone->kind == Kind::capture ? gone->stream : nullptr;
}

bool PoolRoutes::end_route(uint64_t token, CUstream* capture) {
  std::shared_ptr<Route> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = routes_.begin(); it != routes_.end(); ++it) {
      if ((*it)->token == token) {
        gone = *it;
        routes_.erase(it);
        break;
      }
    }
    count_.store(static_cast<int>(routes_.size()), std::memory_order_relaxed);
  }
  if (!gone) return false;
  wait_for_calls(*gone);
  finish(*gone);
  core::CacheBypass::leave();
  *capture = gone->kind == Kind::capture ? gone->stream : nullptr;
  return true;
}

int PoolRoutes::captures_into(core::PoolId pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& r : routes_) n += r->pool == pool && r->kind == Kind::capture ? 1 : 0;
  return n;
}

int PoolRoutes::routes_of(core::PoolId pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& r : routes_) n += r->pool == pool ? 1 : 0;
  return n;
}

// cuStreamGetCaptureInfo and cuStreamIsCapturing are legal during a capture (they neither
// query nor synchronize work). Any failure (a legacy stream beside a blocking capture answers
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) counts as "not capturing": the allocation is not made
// on a stream of the capture.
PoolRoutes::Capture PoolRoutes::capture_of(CUstream s) const {
  Capture c;
  c.asked = true;
  const driver::DriverTable& t = drv_.table();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (drv_.has(driver::EntryPoint::stream_get_capture_info)) {
    cuuint64_t id = 0;
    if (t.stream_get_capture_info(s, &status, &id, nullptr, nullptr, nullptr, nullptr) ==
            CUDA_SUCCESS &&
        status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      c.capturing = true;
      c.id = id;
    }
    return c;
  }
  if (t.stream_is_capturing(s, &status) == CUDA_SUCCESS &&
      status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    c.capturing = true;  // no id: only the route's own stream can be told apart
  }
  return c;
}

bool PoolRoutes::matches(const Route& r, CUstream stream, Capture& c) const {
  switch (r.kind) {
    case Kind::thread:
      return r.thread == std::this_thread::get_id();
    case Kind::filter:
      return r.filter(reinterpret_cast<struct CUstream_st*>(stream), r.filter_ctx) != 0;
    case Kind::capture: {
      if (!c.asked) c = capture_of(stream);
      if (!c.capturing) return false;
      // A special handle names the calling thread's stream: equal handles are the same stream
      // only on the thread that began the route.
      const bool own_thread = !r.special || r.thread == std::this_thread::get_id();
      if (stream == r.stream && own_thread) return true;
      if (c.id == 0) return false;  // the driver gives no capture ids: own stream only
      uint64_t want = r.capture_id.load(std::memory_order_relaxed);
      if (want == 0) {
        if (!own_thread) return false;  // r.stream here would be this thread's stream
        // The route's stream had not begun capturing at begin: learn its capture's id now.
        const Capture mine = capture_of(r.stream);
        if (!mine.capturing || mine.id == 0) return false;
        want = mine.id;
        r.capture_id.store(want, std::memory_order_relaxed);
      }
      return want == c.id;
    }
  }
  return false;
}

namespace {
// Set while this thread runs a filter: an end called from inside a filter does not wait for
// itself.
thread_local int t_in_filter = 0;
}  // namespace

core::PoolId PoolRoutes::route_slow(int device, CUstream stream, bool captures_only) const {
  std::vector<std::shared_ptr<Route>> candidates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      const Route& r = **it;
      if (r.device != device || (captures_only && r.kind != Kind::capture)) continue;
      if (r.kind == Kind::filter) r.in_flight.fetch_add(1, std::memory_order_acq_rel);
      candidates.push_back(*it);
    }
  }
  // Matched without the lock: a filter is the application's code, and may call expanse.
  Capture c;
  core::PoolId found = 0;
  for (const auto& r : candidates) {
    if (found == 0) {
      ++t_in_filter;
      bool hit = false;
      try {
        hit = matches(*r, stream, c);
      } catch (...) {
        hit = false;  // a throwing filter answers no
      }
      --t_in_filter;
      if (hit) found = r->pool;
    }
    if (r->kind == Kind::filter) r->in_flight.fetch_sub(1, std::memory_order_acq_rel);
  }
  return found;
}

void PoolRoutes::wait_for_calls(const Route& r) {
  if (r.kind != Kind::filter || t_in_filter != 0) return;
  while (r.in_flight.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

}  // namespace expanse::api
