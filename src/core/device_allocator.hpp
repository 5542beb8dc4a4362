// One device's allocator: a VA space shared by every stream, a pool of physical pages, blocks
// carved at 512 B, and compaction in VA space — pages under free memory anywhere are unmapped and
// mapped again wherever a new block needs them (DESIGN.md invariant 1).
//
// Request flow: allocate() → where this stream lately freed a block of that size, if still free
// (exact-size reuse) → a free block whose pages are mapped → best fit → carve → ensure_pages():
// pool → new pages (cuMemCreate) and pages reclaimed from under free memory, in the order
// AllocatorOptions::reclaim_before_create says → wait for the streams' work on freed memory,
// reclaim → OOM.
//
// The implementation is split by idea: device_allocator.cpp (allocate/free flow, placement),
// page_supply.cpp (pool, creation, reclaim, giving memory back), stream_order.cpp (freed blocks
// back to the index, fences, record_stream), allocator_introspection.cpp (stats, messages,
// invariant checks).
#pragma once

#include "core/allocator_events.hpp"
#include "core/block_index.hpp"
#include "core/device_driver.hpp"
#include "core/handle_plan.hpp"
#include "core/options.hpp"
#include "core/reservation.hpp"
#include "core/stats.hpp"

#include <cuda.h>

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

  // nullptr for bytes == 0. Throws expanse::out_of_memory, expanse::usage_error (size overflow),
  // expanse::driver_failure. On any throw nothing changed.
  void* allocate(size_t bytes, CUstream stream);
  // Throws expanse::usage_error for a pointer that is not a live block's start (double free,
  // interior or foreign pointer), or whose size is not expected_size (0: any), without changing
  // anything. nullptr is ignored.
  void deallocate(void* ptr, CUstream stream, size_t expected_size = 0);
  // `ptr` is used by work on `stream` too: its memory is reused only after that work completes.
  void record_stream(void* ptr, CUstream stream);

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

  // True if ptr is the start of a live block here; *size gets its requested size.
  bool owns(const void* ptr, size_t* size = nullptr) const;

  DeviceStats stats() const;
  void reset_peaks();
  int device() const noexcept { return drv_.device(); }
  size_t page_size() const noexcept { return page_; }
  size_t capacity() const noexcept { return drv_.total_memory(); }
  const DeviceDriver& driver() const noexcept { return drv_; }

  // Checks every internal invariant (block tiling, index, page counts); for tests. Returns "" or
  // a description of the first violation.
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
  struct ReusePlace {
    CUdeviceptr addr;
    size_t size;  // as carved (a multiple of kBlockAlignment)
  };
  struct Fence {
    CUevent event;
    CUcontext ctx;  // the event's context (events are pooled per context)
    uint64_t seq;
  };
  // One stream identity (stream_order.cpp explains the keys). Frees on it are numbered; a fence
  // recorded on it after free number n proves frees up to n complete once it completes.
  struct StreamState {
    StreamKey key = 0;
    StreamIdentity::Kind kind = StreamIdentity::unknown;
    CUstream handle = nullptr;  // what fences are recorded on (CU_STREAM_LEGACY for legacy keys)
    uint64_t id = 0;            // the driver's id: re-checked before recording on `handle`
    CUcontext ctx = nullptr;    // the stream's context: its events live there
    uint64_t owner_thread = 0;  // per-thread (and unknown) streams: only this thread may record
    bool gone = false;          // `handle` no longer names it: only a context sync covers it
    bool capture_over = false;  // capturing kind: a later call saw its handle not capturing
    uint32_t live_refs = 0;     // live blocks allocated on it or recorded with it
    // Free numbers come from one allocator-wide clock (seq_clock_), so that a state forgotten
    // with everything proven and made again starts at "proven up to now": a pending block's
    // (key, seq) and an unsettled block's seq from before stay satisfied.
    uint64_t free_seq = 0;      // the clock at its latest free (and use ended by a free)
    uint64_t safe_seq = 0;      // frees with seq <= this are known complete
    uint64_t last_used = 0;     // use_clock_ when a call last named it (which to forget first)
    std::deque<Fence> fences;
    // Where this stream freed blocks lately (most recent last, at most lifo_depth): places to
    // put the next block of the same size. Only hints: the memory is in the free index at once,
    // so no size holds pages another size needs (measured on the shared traces: parking freed
    // blocks out of the index, as this did before, held up to 8 % of peak live above it).
    std::vector<ReusePlace> recent;
  };
  // A freed block that other streams used: free again once each (stream, seq) has passed.
  struct Pending {
    BlockIt it;
    std::vector<std::pair<StreamKey, uint64_t>> deps;
  };
  enum class Recorded { yes, not_now, gone };
  struct PageRequest;  // bookkeeping of one ensure_pages() call, for the OOM message

  // "live block of N bytes", "interior pointer, ... into the live block ...", "free memory", or
  // "not a pointer expanse returned". Call with mu_ held.
  std::string describe_pointer_locked(const void* ptr) const;

  Reservation& res(uint32_t id) { return *reservations_[id]; }
  const Reservation& res(uint32_t id) const { return *reservations_[id]; }
  Arena arena_for(size_t bytes) const noexcept {
    return bytes <= opts_.small_max ? Arena::small : Arena::large;
  }
  // The state for what the calling thread means by `s` (identity from DeviceDriver::identify,
  // taken before the lock). May query the stream's context on first sight.
  StreamState& stream_state(CUstream s, const StreamIdentity& id);
  StreamIdentity identify(CUstream s, const char* what, const void* ptr);

  BlockIt find_block(size_t bytes, Arena a, StreamKey stream, PageRequest& req, size_t* offset);
  size_t untouched_pages(const Reservation& r, CUdeviceptr addr, size_t bytes) const;
  bool tight_offset(BlockIt c, size_t sz, size_t* off) const;
  // Whether [c+off, c+off+sz) inside free block c can be used with the handles mapped there:
  // every multi-page handle over its pages lies inside its inner pages, or (splittable) can be
  // split first (it lies inside c's inner pages and c is safe). ready: also every page is mapped
  // and accessible.
  enum class HandleFit { ready, splittable };
  bool handles_fit(BlockIt c, size_t off, size_t sz, HandleFit fit) const;
  Reservation* add_reservation(Arena a, size_t min_bytes);
  // Maps and grants whatever [addr, addr+bytes) of r lacks (the block is carved, not yet live).
  void ensure_pages(Reservation& r, CUdeviceptr addr, size_t bytes, PageRequest& req);
  // Fills `open` slots with handles into `filled`: pool, creation, reclaim, release-and-create.
  void gather_handles(std::vector<HandleSlot>& open,
                      std::vector<std::pair<HandleSlot, CUmemGenericAllocationHandle>>& filled,
                      PageRequest& req);
  // Unmaps up to `want` pages of whole handles lying under safe free blocks into the pool.
  size_t reclaim(size_t want);
  // The one place pages get unmapped: the whole handles over pages [p, q) of r (one cuMemUnmap),
  // into the pool.
  void unmap_handles(Reservation& r, size_t p, size_t q);
  // The one place a handle gets mapped: h (s.count pages) at page s.page of r, not yet accessible.
  void map_handle(Reservation& r, const HandleSlot& s, CUmemGenericAllocationHandle h);
  void pool_put(size_t pages, CUmemGenericAllocationHandle h);
  CUmemGenericAllocationHandle pool_take(size_t pages);  // the pool holds one of that size
  bool pool_has(size_t pages) const {
    auto it = pool_.find(pages);
    return it != pool_.end() && !it->second.empty();
  }
  // Whether a pooled handle of n pages is cheaper (by the cost model) to release and create
  // again inside a larger handle than to map on its own.
  bool exchange_pays(size_t n) const;
  // Releases one pooled handle of `pages` pages (one must be pooled).
  void release_pooled(size_t pages);
  // Releases one pooled handle of the largest size (its pages; 0 when the pool is empty).
  size_t release_largest_pooled();
  // The exact-size hot path: a block of sz bytes where ss freed one lately, if that memory is
  // still free, usable by ss, mapped and needs no driver call. end() otherwise.
  BlockIt reuse_recent(StreamState& ss, size_t sz, Arena a);
  // A freed block (no other stream to wait for) back in the free index, owned by ss until a fence
  // proves ss's work on it done (at once if one has).
  void free_to_index(StreamState& ss, BlockIt it);
  void poll(bool wait);
  // Freed memory that some stream's work may still use (pending or owned free blocks).
  bool has_unfinished_frees() const noexcept { return !pending_.empty() || index_.any_unsafe(); }
  Recorded record_fence(StreamState& ss, bool at_free = false);
  bool context_quiet(CUcontext ctx);
  bool run_context_wide(CUcontext ctx, const std::function<bool()>& op);
  bool sync_context(CUcontext ctx);
  void settle(StreamState& ss);
  void drop_finished_states();
  void free_block(BlockIt it);
  // `stream`: as the caller named it (for the memory history).
  void make_live(BlockIt it, size_t requested, StreamState& ss, CUstream stream);
  void trim_to(size_t max_held_pages, bool release_reservations);
  void release_empty_reservations();
  [[noreturn]] void throw_oom(const PageRequest& req);
  // Raises the mapped/physical peaks to now (plus pages created but not yet mapped or pooled).
  void note_peaks(size_t in_hand);
  size_t held_pages() const noexcept { return mapped_pages_ + pool_pages_; }
  // Pages that may still become touched by live blocks: min(capacity, limit) - touched.
  size_t pages_left() const noexcept {
    const size_t cap = std::min(capacity_pages_, limit_pages_);
    return cap > touched_pages_ ? cap - touched_pages_ : 0;
  }
  CUevent get_event(CUcontext ctx);  // nullptr when the context cannot make one
  void put_event(CUcontext ctx, CUevent e);

  mutable std::mutex mu_;
  DeviceDriver drv_;
  AllocatorOptions opts_;
  size_t page_;
  size_t limit_pages_;
  size_t capacity_pages_;
  size_t va_budget_;

  std::vector<std::unique_ptr<Reservation>> reservations_;
  BlockIndex index_;
  // Physical memory held unmapped, by handle size in pages (no empty entries).
  std::map<size_t, std::vector<CUmemGenericAllocationHandle>> pool_;
  size_t pool_pages_ = 0;
  size_t high_water_ = 0;   // most pages touched by live blocks plus a request's, so far
  size_t max_pages_ = 1;  // most pages per handle created (AllocatorOptions::max_handle_size)
  std::unordered_map<StreamKey, StreamState> streams_;
  std::map<std::pair<uint64_t, uint64_t>, StreamKey> legacy_keys_;  // (legacy id, thread) -> key
  StreamKey next_key_ = StreamKey{1} << 63;  // made-up keys; driver ids stay below
  StreamKey in_use_ = 0;  // the state allocate() holds a reference to (never dropped meanwhile)
  uint64_t seq_clock_ = 0;  // numbers every free on every stream (StreamState::free_seq)
  uint64_t use_clock_ = 0;  // counts stream_state() calls (StreamState::last_used)
  // The stream of the call under way (allocate / deallocate / record_stream), 0 outside one.
  // Its handle is the only one expanse may pass to the driver: the caller vouches for it now;
  // any other may name a destroyed stream (undefined: a 580 driver crashed in
  // cuStreamIsCapturing on one), so other streams are covered by their own calls' fences or
  // a context synchronize.
  StreamKey current_ = 0;
  struct CallStream {  // resets current_ when the call ends
    StreamKey& k;
    ~CallStream() { k = 0; }
  };
  std::vector<Pending> pending_;
  std::unordered_map<CUcontext, std::vector<CUevent>> event_pool_;
  std::vector<std::pair<CUcontext, CUevent>> all_events_;

  size_t mapped_pages_ = 0;
  size_t touched_pages_ = 0;
  size_t va_reserved_ = 0;
  DeviceStats stats_;
  AllocatorEvents* events_ = nullptr;  // guarded by mu_
};

}  // namespace expanse::core
