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
//
// In front of the lock, per-thread caches (thread_cache.hpp, device_front.cpp; off unless
// thread_cache_bytes and thread_cache_entries are set): a free whose block may go back to the
// freeing stream at once parks it in the thread's cache, and that thread's next allocation of the
// same size on the same stream takes it back, neither touching the lock. Parked blocks stay live
// in the books; stats count them as freed without flushing, and every operation that needs the
// true picture (release_cached, set_limit, pool trim and sleep, segments, an allocation that would
// fail) flushes all caches first.
#pragma once

#include "core/base/allocator_events.hpp"
#include "core/placement/block_index.hpp"
#include "core/base/check.hpp"
#include "core/device/device_driver.hpp"
#include "core/base/options.hpp"
#include "core/pages/page_request.hpp"
#include "core/pages/page_supply.hpp"
#include "core/sharing/imported_blocks.hpp"
#include "core/placement/placement.hpp"
#include "core/placement/placement_echo.hpp"
#include "core/placement/workload_shape.hpp"
#include "core/sharing/registrable_blocks.hpp"
#include "core/pools/pool_table.hpp"
#include "core/base/device_stats.hpp"
#include "core/streams/stream_order.hpp"
#include "core/front/thread_cache.hpp"
#include "core/host/host_staging.hpp"

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
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
  // can (cached pages and pool); never touches live blocks. expanse::usage_error, with nothing
  // changed, for a cap below the reservation.
  void set_limit(size_t bytes);

  // ---- the reservation (device_reserve.cpp) ----
  // Makes `bytes` (rounded down to pages; kReserveFree: all the driver says is free, less
  // reserve_margin, within the limit) the physical memory this device holds from now on, used or
  // not: release_cached, reclaim, trimming and sleep never give it back. Growing creates it now
  // (AllocatorOptions::reserve_handle_size handles, max_handle_size by default); shrinking gives
  // back what it no longer covers and no live block uses. Returns the bytes reserved.
  // expanse::usage_error: above the limit or the device's capacity. expanse::out_of_memory when
  // the driver cannot give it whole and reserve_partial is off: the message says what was asked,
  // free and taken, and the reservation is as it was. Replaces the EXPANSE_CONF reserve still
  // pending, if any.
  size_t reserve(size_t bytes);
  static constexpr size_t kReserveFree = SIZE_MAX;
  struct ReserveState {
    size_t reserved_bytes = 0;  // held for the reservation (0: none)
    size_t asked_bytes = 0;     // what it asked; above reserved_bytes when kept partial
    size_t unused_bytes = 0;    // reserved, touched by no live block
    bool pending = false;       // EXPANSE_CONF reserve not yet made (the device's first use)
  };
  ReserveState reservation() const;
  size_t limit() const;

  // Grants device `peer` READWRITE access to every mapping here, present and future. Throws
  // expanse::usage_error when the driver says it cannot access this device's memory.
  void enable_peer_access(int peer);
  std::vector<int> peers() const;

  // ---- pools (pool_table.hpp, device_pools.cpp): private reuse domains ----
  // Creates pool `id` (use count 1). expanse::usage_error: id 0, or used before. A registrable
  // pool's blocks are registrable blocks (registrable_blocks.hpp): each its own exportable,
  // RDMA-capable handle, for NCCL registration and expanse_ipc_export.
  void create_pool(PoolId id, bool registrable = false);
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

  // ---- sleep and wake (sleep_wake.cpp) ----
  // discard_zeroed: discard, and the blocks come back zeroed at wake.
  enum class SleepMode { offload, discard, discard_zeroed };
  // Gives every page of pool `id` (in use, awake) back to the driver, keeping its addresses and
  // blocks: after a synchronize of the device's context (the pool's and every stream's work
  // done; refused while a capture is announced), offload copies each live block to pinned host
  // memory first (adjacent blocks in one copy), discard drops the content (discard_zeroed: the
  // blocks come back zeroed). Its live blocks are then "asleep": allocating into
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
  // Where sleeps stage their bytes from now on (nullptr: pinned here, cuMemHostAlloc). The
  // caller keeps it alive while this allocator may use it, and unsets it (after
  // release_host_backup) before it goes.
  void set_host_staging(HostStaging* staging);

  // ---- sharing across processes (device_sharing_books.cpp) ----
  struct Export {
    int fd = -1;           // a new POSIX fd for the block's handle (the caller closes it)
    size_t extent = 0;     // the handle's bytes (the block's size rounded up to the page)
    size_t requested = 0;  // the block's size as asked for
  };
  // Exports the live registrable block starting at ptr. expanse::usage_error for any other
  // pointer (naming it and what to do), driver_failure when the driver refuses.
  Export export_block(const void* ptr);
  // Maps the exported handles (fds, with their sizes) in a reservation of their extent only;
  // returns the block's address (the mapping's base + offset into the first handle).
  // usage_error for sizes that are not whole granules, an fd the driver refuses, a handle
  // smaller than its size says, or memory of another device.
  void* import_block(const std::vector<int>& fds, const std::vector<size_t>& sizes,
                     size_t offset);
  // Unmaps, releases and frees the VA of an import, after the work of every context that may use
  // it is done (refused with usage_error while a capture is announced). ptr is what
  // import_block returned; usage_error for any other pointer.
  void close_import(void* ptr);
  bool is_import(const void* ptr) const;
  bool is_registrable(const void* ptr) const;

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

  // ---- the thread caches (device_front.cpp) ----
  // Whether thread caches are configured (they may hold small-arena blocks the books count live).
  bool thread_caches_on() const noexcept {
    return opts_.thread_cache_bytes != 0 && opts_.thread_cache_entries != 0;
  }
  // Whether caches may be used now (configured, no memory history, no capture or route).
  bool front_open() const noexcept;
  // The allocation the calling thread's cache serves without the lock, or nullptr.
  void* take_cached(size_t bytes, const StreamIdentity& id);
  // Parks ptr in the calling thread's cache without the lock; false: take the locked path.
  bool park_fast(void* ptr, const StreamIdentity& id, size_t expected_size);
  // A free under the lock (block `it`, live, freed on ss): parks it when it may be; false if not.
  bool park_locked(BlockIt it, StreamOrder::StreamState& ss, const StreamIdentity& id);
  // Gives the parked block at addr back to the books: freed on the stream it was freed on. Out
  // of host memory it throws std::bad_alloc having changed nothing.
  void free_parked_locked(CUdeviceptr addr);
  // Gives parked blocks, taken out of their caches, back to the books; how many it could. Out
  // of host memory the rest stay parked, owed (FrontBlocks::Entry::owed): nothing is lost, and
  // settle_owed_locked frees them at a later locked call.
  size_t free_parked_all_locked(const std::vector<CachedBlock>& blocks);
  // Frees the owed blocks that host memory allows now; how many.
  size_t settle_owed_locked();
  // Every cache's blocks (and owed ones) back to the books, their counts into stats_; how many
  // blocks.
  size_t flush_caches_locked();
  // c's hits and stream queries into stats_ (c.lock held), counted from 0 again.
  void absorb_counts_locked(ThreadCache& c);
  // What parked blocks and owed frees hold, as users see it (freed), and the pages only they
  // touch:
  // stats() tells what a flush would give back without flushing (every cache's counts absorbed).
  struct ParkedShare {
    uint64_t blocks = 0, bytes = 0, requested = 0;
    size_t pages = 0;  // touched by parked blocks only
  };
  // zero_credits: every thread's peak credit from 0 in the same pass (reset_peaks): a block parked
  // between a credit pass and a separate share pass would count as freed for the new peak while
  // its credit let the next hit skip the peak update.
  ParkedShare parked_share_locked(bool zero_credits = false);
  // Clears over_limit_ once the touched pages fit the limit again.
  void recheck_limit_locked();
  // Whether the live block at addr is parked in a thread cache (freed, as users see it).
  bool parked_locked(CUdeviceptr addr) const;
  // "" when every parked block is live in the books with a front entry marked cached.
  std::string check_parked_locked() const;
  // A thread exited with these blocks parked (ThreadCaches::GiveBack).
  void give_back(std::vector<CachedBlock>& blocks, ThreadCache& c);
  // Peaks as users see them (parked blocks are not allocated), after an allocation no peak
  // credit covered; every thread's credit starts again from 0.
  void update_peaks_locked();
  // After an allocation under the lock: the books' figures are the users' when no cache exists;
  // otherwise update_peaks_locked (parked blocks are live in the books, not for users).
  void peaks_after_allocation_locked();
  // The freeing thread's peak credit grows by a free through the locked path.
  void credit_free(size_t size, size_t requested);

  BlockIt place(size_t sz, Arena a, StreamKey stream, PageRequest& req, PoolSlot pool);
  // A registrable block (registrable_blocks.hpp) of bytes in pool id `pool` (0: default).
  void* allocate_registrable(size_t bytes, uint64_t pool, CUstream stream);
  // Frees the registrable block at addr once the device's work is done (a context synchronize,
  // refused while a capture is announced or the stream captures).
  void free_registrable(CUdeviceptr addr, CUstream stream, size_t expected_size);
  // Waits for all work in the device's primary context; usage_error naming `what` when that
  // cannot be done now (a capture is announced, or `stream` captures).
  void sync_for_unmap(const std::string& what, CUstream stream);
  BlockIt place_once(size_t sz, Arena a, StreamKey stream, PageRequest& req, PoolSlot pool);
  // The one corner where a handle may lie beyond what a block asked for (docs/design.md,
  // "Reservations"; the contract's invariant 1): a request the reservation covers, when no
  // handle of the shapes it needs can be had (nothing can be created before a release: every
  // free byte of the device is another process's). It takes pooled reserved handles whole, as
  // few as cover its pages with the fewest spare, over unmapped VA of the large arena; the block
  // is carved over all of them and its spare pages are stranded (reserve_stranded_bytes) until
  // it is freed, when they are free memory cut to shape like any other. end() when the pool and
  // safe free memory hold too few pages or no VA is left.
  BlockIt place_whole_handles(size_t sz, StreamKey stream, PageRequest& req, PoolSlot pool);
  BlockIt place_echoed(uint64_t point, uint64_t short_point, size_t sz, Arena a,
                       const StreamOrder::StreamState& ss);
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
  // Forgets pool s (returned, no live block), freeing its host staging. Out of host memory it
  // throws std::bad_alloc having changed nothing; after make_room_to_forget_pool(s) it cannot.
  void forget_pool(PoolSlot s);
  // Allocates now what forget_pool(s) would. May throw std::bad_alloc; changes nothing else.
  void make_room_to_forget_pool(PoolSlot s);
  // Room to forget b's pool (not the default) when freeing b leaves it, returned, with no live
  // block.
  void make_room_if_emptying(const Block& b);
  // The mapped handles under pool s's blocks that lie on no page another pool's block, or a
  // default block other than a safe free one, overlaps: what a sleep gives back.
  std::vector<ReclaimableHandle> sleeping_handles(PoolSlot s) const;
  // Frees the host staging of forgotten pools (call where no capture can be under way).
  void free_orphan_backups_locked();
  // A sleep's host staging: from host_staging_ when set and it has some, else pinned here.
  void* alloc_backup(size_t bytes);
  void free_backup(void* p) noexcept;
  // Maps every block of pool s again, touches its asleep blocks and copies their bytes back.
  void wake_locked(PoolSlot s);
  PoolStats pool_stats_locked(PoolSlot s) const;
  BlockIt find_block(size_t sz, Arena a, StreamKey stream, PageRequest& req, size_t* offset,
                     bool whole_pages = false);
  // `stream`: as the caller named it (for the memory history).
  void make_live(BlockIt it, size_t requested, StreamOrder::StreamState& ss, CUstream stream);
  void trim_after_free();
  // The EXPANSE_CONF reservation, at the device's first allocation (mu_ held).
  void reserve_pending_locked();
  size_t reserve_locked(size_t bytes, bool partial);
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
  WorkloadShape shape_;  // whether the workload repeats its structure with other sizes
  // An allocation (freed: false) or free of sz bytes in the large arena: the echo's history and
  // the workload's shape.
  void note_large(size_t sz, bool freed) noexcept {
    echo_.note(sz, freed);
    shape_.note(sz, freed);
  }
  size_t large_live_ = 0;  // live blocks of the large arena (parked blocks are all small)
  // Blocks place_whole_handles made, by address: their stranded pages (reserve_stranded_bytes).
  std::unordered_map<CUdeviceptr, size_t> stranded_;
  size_t stranded_pages_ = 0;
  PoolTable pools_;
  RegistrableBlocks registrable_;
  ImportedBlocks imports_;
  bool reserve_pending_ = false;  // EXPANSE_CONF reserve, made at the first allocation
  CUstream copy_stream_ = nullptr;  // sleep and wake copies; made at the first
  std::vector<void*> orphan_backups_;  // host staging of forgotten pools, freed when safe
  HostStaging* host_staging_ = nullptr;  // the runtime's host pools (set_host_staging)
  std::atomic<bool> history_on_{false};  // events_ != nullptr, read without the lock
  // Live blocks touch more pages than a lowered limit allows: caches stay shut until frees bring
  // them under it (a block handed back from a cache would touch pages the limit no longer has).
  std::atomic<bool> over_limit_{false};
  ThreadCaches caches_;
  // Parked blocks owed to the books (free_parked_all_locked): how many, their bytes.
  size_t owed_frees_ = 0;
  uint64_t owed_bytes_ = 0;
  uint64_t owed_requested_ = 0;
};

class DeviceAllocator::CheckedScope {
 public:
  CheckedScope(const DeviceAllocator& a, const char* call) : a_(a), call_(call) {}
  CheckedScope(const CheckedScope&) = delete;
  CheckedScope& operator=(const CheckedScope&) = delete;
#ifdef EXPANSE_CHECKED
  ~CheckedScope() {
    std::string violation;
    try {
      violation = a_.check_invariants_locked();
    } catch (const std::bad_alloc&) {
      return;  // out of host memory: no room to check now (the next call checks)
    }
    if (!violation.empty()) books_violated(call_, violation);
  }
#endif

 private:
  [[maybe_unused]] const DeviceAllocator& a_;
  [[maybe_unused]] const char* call_;
};

}  // namespace expanse::core
