// Per-device accounting. Every figure is exact (docs/design.md, invariant 5).
#pragma once

#include "driver_api/entry_points.hpp"
#include "expanse/stats_fields.h"

#include <array>
#include <cstdint>

namespace expanse::core {

struct DeviceStats {
  // The allocator's figures of expanse_stats (KEPT in expanse/stats_fields.h), same names, same
  // types: requested_bytes, mapped_bytes, the peaks, num_allocs, ...
#define EXPANSE_KEPT_MEMBER_(type, name, doc) type name = 0;
#define EXPANSE_IGNORE_(...)
  EXPANSE_STATS_FIELDS(EXPANSE_KEPT_MEMBER_, EXPANSE_IGNORE_, EXPANSE_IGNORE_)
#undef EXPANSE_KEPT_MEMBER_
#undef EXPANSE_IGNORE_

  // Driver calls per entry point and their modeled cost (expanse_stats: driver_calls and
  // modeled_driver_seconds, converted when read).
  std::array<uint64_t, driver::kEntryPointCount> driver_calls{};
  double modeled_driver_ns = 0;
  // Read-only stream lookups (cuStreamGetId, cuStreamGetCtx, cuStreamIsCapturing, capture-mode
  // switches): about one per allocate and free, cheap user-mode calls on a GPU. Counted apart so
  // that driver_calls measures work (zero in a steady state).
  uint64_t stream_queries = 0;
  // Stream identities expanse keeps state for (frees to prove done, live blocks). Bounded: a
  // stream whose state holds nothing is forgotten once there are more than a few dozen.
  uint64_t tracked_streams = 0;
  // Allocations thread caches served without the device lock (each also counted in num_allocs,
  // and its free in num_frees), up to the last flush.
  uint64_t thread_cache_hits = 0;

  uint64_t total_driver_calls() const noexcept {
    uint64_t n = 0;
    for (auto c : driver_calls) n += c;
    return n;
  }
};

// What a pool's sleeps and wakes did and cost: the number of sleeps, the latest of each.
struct SleepCycles {
  uint64_t sleeps = 0;
  uint64_t released_bytes = 0;  // physical memory the latest sleep gave back to the driver
  double sleep_modeled_ns = 0;  // the latest sleep's driver calls, priced by the cost model
  double wake_modeled_ns = 0;
  uint64_t sleep_wall_ns = 0;   // the latest sleep as this process timed it
  uint64_t wake_wall_ns = 0;
};

// One pool's figures (DeviceAllocator::pool_stats). Exact: recounted from the blocks.
struct PoolStats {
  uint64_t id = 0;
  int use_count = 0;
  bool returned = false;        // released and its free memory given to the default pool
  uint64_t live_blocks = 0;
  uint64_t requested_bytes = 0;  // live blocks, as asked for
  uint64_t live_bytes = 0;       // live blocks, as carved (multiples of 512 B)
  uint64_t cached_bytes = 0;     // free (and pending) blocks still the pool's
  uint64_t physical_bytes = 0;   // mapped pages under its blocks (an edge page counted once per pool)
  bool asleep = false;           // its pages given back (core/sleep_wake.cpp)
  uint64_t host_backup_bytes = 0;  // pinned host staging it holds (content while asleep)
  SleepCycles cycles;  // its sleeps and wakes
};

}  // namespace expanse::core
