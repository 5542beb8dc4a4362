// One device's allocator: a VA space shared by every stream, a pool of physical pages, blocks
// carved at 512 B, and compaction in VA space — pages under free memory anywhere are unmapped and
// mapped again wherever a new block needs them (docs/design.md, invariant 1).
//
// It holds the lock and runs each request through three parts, each its own type:
//   Placement (placement.hpp): the reservations, the free index, where a block goes;
//   PageSupply (page_supply.hpp): pages for it (pool, new handles, reclaim, wait), the page books;
//   StreamOrder (stream_order.hpp): when freed memory is safe for which stream.
// allocate() → where this stream lately freed a block of that size, if still free (exact-size
// reuse) → a free block whose pages are mapped → best fit → carve → PageSupply::ensure_pages
// → live. deallocate() → StreamOrder (pending on other streams, or back in the free index owned by
// the stream until a fence proves its work done) → trim above release_threshold.
#pragma once

#include "core/allocator_events.hpp"
#include "core/block_index.hpp"
#include "core/check.hpp"
#include "core/device_driver.hpp"
#include "core/options.hpp"
#include "core/page_request.hpp"
#include "core/page_supply.hpp"
#include "core/placement.hpp"
#include "core/placement_echo.hpp"
#include "core/pool_table.hpp"
#include "core/stats.hpp"
#include "core/stream_order.hpp"

#include <cuda.h>

#include <mutex>
#include <string>
#include <vector>

namespace expanse::core {

class DeviceAllocator {
 public:
  DeviceAllocator(const driver::LoadedDriver& drv, int device, const AllocatorOptions& opts);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // nullptr for bytes == 0. pool: 0 (the default pool) or a pool created here whose use count
  // is above 0; the block belongs to it for life. Throws expanse::out_of_memory,
  // expanse::usage_error (size overflow, unknown or released pool), expanse::driver_failure. On
  // any throw nothing changed.
  void* allocate(size_t bytes, CUstream stream, PoolId pool = 0);
  // Throws expanse::usage_error for a pointer that is not a live block's start (double free,
  // interior or foreign pointer), or whose size is not expected_size (0: any), without changing
  // anything. nullptr is ignored. join: a pool in use (a capture's, whose graph will use this
  // memory on every replay); a block of the default pool freed here joins it instead of going
  // back to the default pool.
  void deallocate(void* ptr, CUstream stream, size_t expected_size = 0, PoolId join = 0);
  // `ptr` is used by work on `stream` too: its memory is reused only after that work completes.
  void record_stream(void* ptr, CUstream stream);

  // The capture the application announced on stream s has ended (StreamOrder::capture_ended).
  // What the capture freed in a pool becomes the pool's to reuse on any stream: a pool's graphs
  // replay in capture order and never concurrently (the promise PyTorch's shared graph pools
  // make too), and no replay has run yet. A capture's frees in the default pool still wait for
  // a synchronize.
  void capture_ended(CUstream s);

  // Waits for streams' work on free memory, then unmaps and releases every cached page.
  void release_cached();
  // Caps physical memory held (mapped + pooled); kNoLimit removes the cap. Trims at once what it
  // can (cached pages and pool); never touches live blocks.
  void set_limit(size_t bytes);
  size_t limit() const;

  // Grants device `peer` READWRITE access to every mapping here, present and future. Throws
  // expanse::usage_error when the driver says it cannot access this device's memory.
  void enable_peer_access(int peer);
  std::vector<int> peers() const;

  // ---- pools (pool_table.hpp, device_pools.cpp): private reuse domains ----
  // Creates pool `id` (use count 1). expanse::usage_error: id 0, or used before.
  void create_pool(PoolId id);
  // Use count + 1; expanse::usage_error for an unknown or released pool.
  void retain_pool(PoolId id);
  // Use count - 1. At 0 the pool is released: no allocation goes to it any more, and once its
  // work is proven done (a synchronize of the device's context, when no capture is announced
  // there: at the next release_cached, trim_pool, or allocation that would fail otherwise) its
  // free memory becomes the default pool's. Its live blocks stay valid.
  void release_pool(PoolId id);
  // Gives a released pool's cached memory back to the driver now. False when its work cannot be
  // proven done now (a capture is announced in the device's context); nothing changed then.
  // expanse::usage_error for a pool still in use (use count above 0) or unknown.
  bool trim_pool(PoolId id);
  // Exact figures of pool `id`; expanse::usage_error for an unknown one.
  PoolStats pool_stats(PoolId id) const;
  // Whether pool `id` was created here and is not yet forgotten.
  bool has_pool(PoolId id) const;

  // ---- sleep and wake (pool_sleep.cpp) ----
  enum class SleepMode { offload, discard };
  // Gives every page of pool `id` (in use, awake) back to the driver, keeping its addresses and
  // blocks: after a synchronize of the device's context (the pool's and every stream's work
  // done; refused while a capture is announced), offload copies each live block to pinned host
  // memory first, discard drops the content. Its live blocks are then "asleep": allocating into
  // the pool or recording a stream on them is an error, a free is allowed. On a throw the pool is
  // awake with its data. False, with nothing changed, when the context cannot be synchronized
  // now (a capture is announced there, or the synchronize failed).
  bool sleep_pool(PoolId id, SleepMode mode);
  // Maps pages under every block of pool `id` again, at the same addresses, and copies an
  // offloaded pool's content back; done when it returns. On a throw the pool is still asleep
  // with its backup, and a later wake may succeed.
  void wake_pool(PoolId id);
  bool pool_is_asleep(PoolId id) const;
  // Frees the pinned host staging of every awake or released pool (none of an asleep pool's
  // that can still wake), unless a capture is announced in the device's context (freeing pinned
  // memory synchronizes); the bytes freed.
  size_t release_host_backup();

  // The pool of the live block starting at ptr (0: the default pool); expanse::usage_error when
  // ptr is not a live block's start here.
  PoolId pool_of(const void* ptr) const;

  // True if ptr is the start of a live block here; *size gets its requested size.
  bool owns(const void* ptr, size_t* size = nullptr) const;

  DeviceStats stats() const;
  void reset_peaks();
  int device() const noexcept { return drv_.device(); }
  size_t page_size() const noexcept { return page_; }
  size_t capacity() const noexcept { return drv_.total_memory(); }
  const DeviceDriver& driver() const noexcept { return drv_; }

  // Checks every internal invariant (block tiling, index, page counts). Returns "" or a
  // description of the first violation. A checked build (EXPANSE_CHECKED) runs it after every
  // call that changes the books and aborts on a violation.
  std::string check_invariants() const;
  // For diagnosing stream-order failures in tests: the block at or around ptr (state, owner,
  // sequence number, safety), every stream identity expanse tracks (kind, driver id, handle,
  // context, free/safe sequence numbers, fences and their events) and every pending block.
  std::string describe_stream_order(const void* ptr) const;

  // Memory history: `e` (or nullptr) is told of every alloc, free, map, unmap and OOM from now on.
  // It must outlive this allocator or be replaced first.
  void set_events(AllocatorEvents* e);
  // The mapped ranges and the blocks in them, for snapshots.
  std::vector<SegmentView> segments() const;

 private:
  // Runs check_invariants (mu_ held) when the scope ends, in a checked build; aborts with the
  // violation on stderr.
  class CheckedScope;

  BlockIt place(size_t sz, Arena a, StreamKey stream, PageRequest& req, PoolSlot pool);
  BlockIt place_once(size_t sz, Arena a, StreamKey stream, PageRequest& req, PoolSlot pool);
  BlockIt place_echoed(uint64_t point, size_t sz, Arena a, const StreamOrder::StreamState& ss);
  // Released pools whose work a context synchronize now proves done give their free memory to
  // the default pool. False when none did (none waits, or a capture is announced).
  bool return_released_pools();
  // Pool s (released, proven): its free and pending blocks become the default pool's.
  void return_pool(PoolSlot s);
  // The books of pool s for a block of it becoming live (+1) or freed (-1).
  void count_in_pool(const Block& b, int sign);
  // "; pools holding memory: ..." for the out-of-memory message, or "".
  std::string pools_holding_memory() const;
  std::string check_pools_locked() const;
  // Forgets pool s (returned, no live block), freeing its host staging.
  void forget_pool(PoolSlot s);
  // The mapped handles under pool s's blocks that lie on no page another pool's block, or a
  // default block other than a safe free one, overlaps: what a sleep gives back.
  std::vector<ReclaimableHandle> sleeping_handles(PoolSlot s) const;
  // Frees the host staging of forgotten pools (call where no capture can be under way).
  void free_orphan_backups_locked();
  // Maps every block of pool s again, touches its asleep blocks and copies their bytes back.
  void wake_locked(PoolSlot s);
  PoolStats pool_stats_locked(PoolSlot s) const;
  BlockIt find_block(size_t sz, Arena a, StreamKey stream, PageRequest& req, size_t* offset,
                     bool whole_pages = false);
  // `stream`: as the caller named it (for the memory history).
  void make_live(BlockIt it, size_t requested, StreamOrder::StreamState& ss, CUstream stream);
  void trim_after_free();
  void grant_peer(int peer);
  void unmap_all_quietly();
  [[noreturn]] void throw_oom(const PageRequest& req);
  // "live block of N bytes", "interior pointer, ... into the live block ...", "free memory", or
  // "not a pointer expanse returned". Call with mu_ held.
  std::string describe_pointer_locked(const void* ptr) const;
  std::string check_invariants_locked() const;

  mutable std::mutex mu_;
  DeviceDriver drv_;
  AllocatorOptions opts_;  // with every derived value filled in (options_for)
  size_t page_;
  DeviceStats stats_;
  AllocatorEvents* events_ = nullptr;  // guarded by mu_
  Placement placement_;
  StreamOrder streams_;
  PageSupply supply_;
  PlacementEcho echo_;  // where allocations went at each point of the workload
  PoolTable pools_;
  CUstream copy_stream_ = nullptr;  // sleep and wake copies; made at the first
  std::vector<void*> orphan_backups_;  // host staging of forgotten pools, freed when safe
};

class DeviceAllocator::CheckedScope {
 public:
  CheckedScope(const DeviceAllocator& a, const char* call) : a_(a), call_(call) {}
  CheckedScope(const CheckedScope&) = delete;
  CheckedScope& operator=(const CheckedScope&) = delete;
#ifdef EXPANSE_CHECKED
  ~CheckedScope() {
    const std::string violation = a_.check_invariants_locked();
    if (!violation.empty()) books_violated(call_, violation);
  }
#endif

 private:
  [[maybe_unused]] const DeviceAllocator& a_;
  [[maybe_unused]] const char* call_;
};

}  // namespace expanse::core
