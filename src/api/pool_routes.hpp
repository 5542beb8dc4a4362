// Routes: which pool an allocation goes to when the caller names none (expanse_malloc,
// expanse_torch_malloc, the C++ allocate), as PyTorch's allocator routes allocations to a CUDA
// graph's private pool (its captures_underway list).
//
// A route sends the allocations on its pool's device that it matches to the pool: a capture route
// those made on any stream of one stream capture (the capture the route's stream is in, side
// streams forked into it included), a thread route those the calling thread makes, a filter route
// those whose stream the application's filter accepts. Routes are tried newest first; the first
// that matches wins; none: the default pool. With no route at all an allocation pays one relaxed
// atomic load here and nothing else.
//
// A block of the default pool freed on a stream of a capture routed to pool P joins P
// (join_for_free): the graph uses its memory on every replay, so it must not go back to others.
#pragma once

#include "core/pools/pool_table.hpp"
#include "driver/driver.hpp"

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace expanse::api {

// int filter(stream, ctx): non-zero routes an allocation on that stream to the pool.
using PoolFilter = int (*)(struct CUstream_st* stream, void* ctx);

class PoolRoutes {
 public:
  explicit PoolRoutes(const driver::LoadedDriver& drv) : drv_(drv) {}
  // Ends every capture announcement its capture routes made.
  ~PoolRoutes();
  PoolRoutes(const PoolRoutes&) = delete;
  PoolRoutes& operator=(const PoolRoutes&) = delete;

  // Each begin returns a token that names the route (end_route). The caller has checked that
  // `pool` (on `device`) is in use. begin_capture: `announced_ctx` is the context whose capture
  // announcement the route made (ended with the route), or nullptr.
  uint64_t begin_capture(core::PoolId pool, int device, CUstream stream, CUcontext announced_ctx);
  uint64_t begin_thread(core::PoolId pool, int device);
  uint64_t begin_filter(core::PoolId pool, int device, PoolFilter filter, void* ctx);
  // Ends the newest route of `pool`. Throws usage_error naming `what` and the pool when it has
  // none (never begun, or ended already). Returns the stream of a capture route (whose capture
  // has ended: the caller tells the allocators), else nullptr.
  CUstream end(core::PoolId pool, const char* what);
  // Ends the route `token` names; false if it has ended already. *capture: as end() returns.
  bool end_route(uint64_t token, CUstream* capture);
  // How many capture routes `pool` has (a capture may be recording into it).
  int captures_into(core::PoolId pool) const;
  // How many routes `pool` has now.
  int routes_of(core::PoolId pool) const;

  // The pool an allocation on `device`, ordered on `stream`, goes to (0: the default pool).
  core::PoolId route(int device, CUstream stream) const {
    if (count_.load(std::memory_order_relaxed) == 0) return 0;
    return route_slow(device, stream, /*captures_only=*/false);
  }
  // The pool a default-pool block freed on `device`, ordered on `stream`, joins: that of the
  // capture route whose capture `stream` is in (0: none).
  core::PoolId join_for_free(int device, CUstream stream) const {
    if (count_.load(std::memory_order_relaxed) == 0) return 0;
    return route_slow(device, stream, /*captures_only=*/true);
  }

 private:
  enum class Kind : uint8_t { capture, thread, filter };
  struct Route {
    uint64_t token = 0;
    core::PoolId pool = 0;
    int device = 0;
    Kind kind = Kind::thread;
    CUstream stream = nullptr;        // capture: the stream named at begin
    // capture on a special handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD): the handle
    // names the beginning thread's stream only, so only that thread may compare handles or
    // learn the capture's id through it.
    bool special = false;
    CUcontext announced = nullptr;    // capture: the context whose announcement it made
    std::thread::id thread;           // thread; capture on a special handle: the beginner
    PoolFilter filter = nullptr;      // filter
    void* filter_ctx = nullptr;
    // capture: the capture's id, learned at the first match attempt after the route's stream
    // began capturing (0: not yet known).
    mutable std::atomic<uint64_t> capture_id{0};
    // filter: allocations that may still call it (taken under the routes' lock); an end waits
    // for them, so that a filter and its ctx are never called after expanse_pool_end returns.
    mutable std::atomic<int> in_flight{0};
  };
  // What one allocation's stream is in: asked of the driver at most once per call.
  struct Capture {
    bool asked = false;
    bool capturing = false;
    uint64_t id = 0;  // 0: the driver cannot say (no cuStreamGetCaptureInfo)
  };

  core::PoolId route_slow(int device, CUstream stream, bool captures_only) const;
  bool matches(const Route& r, CUstream stream, Capture& c) const;
  // Waits until no allocation is still calling r's filter (none from inside a filter).
  static void wait_for_calls(const Route& r);
  // Whether s captures now, and the capture's id where the driver can tell it.
  Capture capture_of(CUstream s) const;
  // A route of `kind` sending allocations to `pool` on `device`; the caller sets the rest.
  static std::shared_ptr<Route> route(core::PoolId pool, int device, Kind kind);
  uint64_t add(std::shared_ptr<Route> r);
  void finish(const Route& r);  // ends its announcement, if any

  const driver::LoadedDriver& drv_;
  std::atomic<int> count_{0};
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Route>> routes_;  // oldest first
  uint64_t next_token_ = 1;
};

}  // namespace expanse::api
