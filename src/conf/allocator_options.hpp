// The allocator's options as EXPANSE_CONF sets them: per-device tuning, zero meaning "derive from
// the device". A plain struct at the bottom of the layers, so that the parser (conf/config.hpp),
// the allocator (core/) and the tools share one definition.
#pragma once

#include <cstddef>
#include <cstdint>

namespace expanse::conf {

inline constexpr size_t kNoLimit = SIZE_MAX;

struct AllocatorOptions {
  size_t page_size = 0;          // physical page (handle) size; 0 = device granularity
  size_t limit = kNoLimit;       // most physical memory held (mapped + pooled), bytes
  size_t release_threshold = kNoLimit;  // cached memory above this is returned to the driver
  size_t small_max = size_t{1} << 20;   // requests up to this size go to the small-block arena
  size_t va_size = 0;            // VA per large-arena reservation; 0 = 2 x capacity
  size_t small_va_size = 0;      // VA per small-arena reservation; 0 = capacity / 4 (>= 1 GiB)
  size_t va_budget = 0;          // most VA reserved on this device; 0 = 64 x capacity
  size_t lifo_depth = 16;        // per stream: places of recent frees kept for exact-size reuse
  // Where a request's missing pages come from once the pool is empty. false (default): new pages
  // while the device and the limit allow, pages reclaimed from under free memory after that — a
  // repeated workload settles into zero driver calls. true: reclaim first, so physical memory
  // stays as close as possible to live memory, at the cost of remapping in steady state.
  bool reclaim_before_create = false;
  // Every device for which cuDeviceCanAccessPeer says it can gets READWRITE access to every
  // mapping (EXPANSE_CONF peer_access:auto|none); expanse_enable_peer_access adds one explicitly.
  bool peer_access_auto = true;
  // What a NULL stream argument means (EXPANSE_CONF null_stream:legacy|per_thread): the legacy
  // default stream of the current context, one stream for every thread (CUDA's default, and what
  // PyTorch and RMM pass), or, for code built with --default-stream per-thread, the calling
  // thread's per-thread default stream.
  bool null_stream_per_thread = false;
  // cuMemCreate asks for GPUDirect RDMA capability where the device supports it (rdma:auto|off).
  bool rdma = true;
  // Every allocation of the default pool is a registrable block (EXPANSE_CONF registrable:on):
  // its own exportable handle, for expanse_ipc_export and NCCL registration of any buffer.
  bool registrable = false;
  // Largest handle (one cuMemCreate) backing a block's inner pages, rounded down to a whole number
  // of pages; anything up to the page size gives one handle per page.
  size_t max_handle_size = size_t{1} << 30;
  // Physical memory may exceed the most pages ever touched by live blocks by touched/256 plus
  // this much before pages are reclaimed from under free memory rather than created. kNoLimit
  // (default): no high-water mark, create while the device allows. Measured on the shared
  // traces, a mark keeps the footprint nearer the live set (cs336a train 1.066 -> 1.024 x live)
  // but the reclaiming never settles: thousands of driver calls in every later repeat.
  size_t high_water_slack = kNoLimit;
  // Physical memory taken at the device's first use and never given back by reclaim, trimming or
  // release_cached (EXPANSE_CONF reserve:SIZE|FRACTION|free). reserve_bytes: 0 none; reserve_free:
  // all the driver says is free then, less reserve_margin (and within the limit).
  size_t reserve_bytes = 0;
  bool reserve_free = false;
  size_t reserve_margin = size_t{512} << 20;  // room left for the CUDA context, NCCL, cuBLAS
  // true: a reservation the driver cannot give whole keeps what it got; false: it fails, and
  // nothing is held for it.
  bool reserve_partial = false;
  // The largest handles a reservation is made of (0, the default: max_handle_size). Large ones
  // are reshaped into the handles blocks ask for; a page or less gives one-page handles, never
  // reshaped, which serve any block without a cuMemCreate at a mapping per page (docs/design.md,
  // "Reservations").
  size_t reserve_handle_size = 0;
  // false (the default): a reservation never dips. Reshaping reserved handles creates the new
  // shapes before it releases what they replace, in memory beyond the reservation; without that
  // room it maps what it holds, or takes a larger handle whole (docs/design.md, "Reservations").
  // true: what is reshaped is released first and created again after, a little faster and
  // needing no room, at the risk its name says: between the two another process may take the
  // memory, and the reservation is smaller than promised until it can be created again.
  bool reserve_may_dip = false;
  // Per-thread caches of freed blocks (core/front/thread_cache.hpp): the most bytes and blocks one
  // thread's cache holds for one device; 0 in either turns them off. Off here (the replayer and
  // the tools time the allocator itself); EXPANSE_CONF turns them on (kDefaultThreadCache*).
  size_t thread_cache_bytes = 0;
  size_t thread_cache_entries = 0;
};

// What EXPANSE_CONF gives the library unless thread_cache / thread_cache_entries say otherwise.
inline constexpr size_t kDefaultThreadCacheBytes = size_t{32} << 20;
inline constexpr size_t kDefaultThreadCacheEntries = 128;

}  // namespace expanse::conf
