// Whether thread caches (thread_cache.hpp) are bypassed process-wide: while any capture is
// announced (capture_announcements.hpp) or any pool route exists (api/pool_routes.hpp), every
// allocation and free takes the device lock, so that no block cached before a graph capture is
// handed to the capture, and nothing freed while one may be recording enters a cache.
//
// One counter for the process (a capture may fork into streams of other threads; a route may
// match any thread): each announcement and each route enters once and leaves once.
#pragma once

namespace expanse::core {

class CacheBypass {
 public:
  static void enter() noexcept;
  static void leave() noexcept;
  static bool active() noexcept;
};

}  // namespace expanse::core
