// Where physical pages come from and where they go, and how many there are.
//
// A request's missing pages come from, in turn: the pool of unmapped handles; new handles
// (cuMemCreate) while the device and the limit allow; handles reclaimed from under safe free
// memory (compaction in VA space: docs/design.md, invariant 1), in the order
// AllocatorOptions::reclaim_before_create says; and last, after waiting for every stream's work
// on freed memory, reclaim again. Under pressure slots are split to use smaller pooled handles,
// and pooled handles too large for any slot are released so smaller ones can be created: a
// request fails only when the pages do not exist.
//
// The books: pages touched by live blocks, mapped, pooled (held = mapped + pooled), the limit on
// held pages, the device's capacity and the reservation (pages held that reclaim, trimming and
// give_back never release; page_reserve.cpp). map_handle and unmap_handles are the one place each that
// pages get mapped and unmapped.
#pragma once

#include "core/base/allocator_events.hpp"
#include "core/device/device_driver.hpp"
#include "core/pages/handle_plan.hpp"
#include "core/pages/handle_pool.hpp"
#include "core/base/options.hpp"
#include "core/pages/page_request.hpp"
#include "core/placement/placement.hpp"
#include "core/placement/reservation.hpp"
#include "core/base/device_stats.hpp"
#include "core/streams/stream_order.hpp"

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace expanse::core {

class PageSupply {
 public:
  PageSupply(DeviceDriver& drv, Placement& placement, StreamOrder& streams, DeviceStats& stats,
             const AllocatorOptions& opts, size_t page);
  PageSupply(const PageSupply&) = delete;
  PageSupply& operator=(const PageSupply&) = delete;

  // ---- the books (pages) ----
  size_t touched_pages() const noexcept { return touched_pages_; }
  size_t mapped_pages() const noexcept { return mapped_pages_; }
  size_t pooled_pages() const noexcept { return pool_.pages(); }
  // Held: mapped + pooled + outside (registrable blocks, outside the page books) + retired.
  size_t held_pages() const noexcept {
    return mapped_pages_ + pool_.pages() + outside_pages_ + retired_pages_;
  }
  size_t outside_pages() const noexcept { return outside_pages_; }
  // Pages of registrable blocks (registrable_blocks.hpp) came (+) or went (-): they count
  // against the capacity and the limit like any block's.
  void add_outside_pages(size_t n) noexcept { outside_pages_ += n; }
  void remove_outside_pages(size_t n) noexcept { outside_pages_ -= n; }
  size_t capacity_pages() const noexcept { return capacity_pages_; }
  // SIZE_MAX: no limit.
  size_t limit_pages() const noexcept { return limit_pages_; }
  void set_limit_pages(size_t n) noexcept { limit_pages_ = n; }
  // Pages that may still become touched by live blocks: min(capacity, limit) - touched.
  size_t pages_left() const noexcept {
    const size_t cap = std::min(capacity_pages_, limit_pages_);
    const size_t used = touched_pages_ + outside_pages_;
    return cap > used ? cap - used : 0;
  }
  // A block over [addr, addr+bytes) of r became live, or stopped being.
  void touch(Reservation& r, CUdeviceptr addr, size_t bytes) {
    touched_pages_ += r.touch(addr, bytes);
    EXPANSE_ASSERT(touched_pages_ <= mapped_pages_);
  }
  void untouch(Reservation& r, CUdeviceptr addr, size_t bytes) {
    const size_t n = r.untouch(addr, bytes);
    EXPANSE_ASSERT(n <= touched_pages_);
    touched_pages_ -= n;
  }
  // Whether handles are refined (docs/design.md, "Settling on a varying workload"): once the
  // workload repeats its structure with other sizes (WorkloadShape), for good, the large arena's
  // new pages are one-page handles, a split cuts the whole handle into one-page handles, and the
  // multi-page handles made before that lie under free memory are cut the same way
  // (refine_freed), so that block boundaries falling anywhere later need no split.
  void set_refine(bool on) noexcept {
    if (on && !refine_) sweep_ = true;
    refine_ = on;
  }
  bool refining() const noexcept { return refine_; }
  // While refining: a block of the large arena's default pool was freed over [addr, addr+bytes)
  // of r, into the free index (pending: false) or waiting for other streams that used it
  // (pending: true). Whether a multi-page handle lies under it that the caller should cut at once
  // (refine_freed), in the call that freed it, so that what follows (the next step of a training
  // loop, a workload started over) finds pages that fit any block. A pending block's handles
  // are cut once it leaves the pending list (StreamOrder::pending_released).
  bool note_freed(const Reservation& r, CUdeviceptr addr, size_t bytes, bool pending) {
    if (!refine_ || !placement_.holds_coarse(r.id, addr, bytes)) return false;
    if (pending) {
      if (!pending_coarse_) pending_seen_ = streams_.pending_released();
      pending_coarse_ = true;
      return false;
    }
    sweep_ = true;
    next_sweep_ = 0;
    return true;
  }
  // While refining, when multi-page handles may lie under free memory of the large arena (once
  // the workload starts varying, and after note_freed): cuts them into one-page handles, at most
  // kRefinePagesPerCall pages a call (one call's latency stays bounded), until none is left.
  // Memory `stream` freed is proven done first by waiting for its own fence
  // (StreamOrder::prove_own: its free memory merges with what it frees next, so a query alone
  // may never catch up with it); other streams' by asking their fences, at most every
  // kRefineAskEvery calls. Best effort: a page the driver will not create again stays unmapped
  // (free memory, nothing lost), and a failure is not the caller's. Called at every allocation of
  // the large arena's default pool, and at frees note_freed answers true for.
  void refine_freed(StreamKey stream);
  static constexpr size_t kRefinePagesPerCall = 1024;
  static constexpr uint64_t kRefineAskEvery = 256;
  // Raises the mapped/physical peaks to now (plus in_hand pages created but not yet mapped or
  // pooled).
  void note_peaks(size_t in_hand);
  // Memory history: told of every map and unmap.
  void set_events(AllocatorEvents* e) noexcept { events_ = e; }

  // ---- the reservation (page_reserve.cpp) ----
  size_t reserved_pages() const noexcept { return reserved_pages_; }
  // Whether reserved pages are reshaped into the handles blocks ask for (page_gathering.cpp):
  // not when the reservation is made of one-page handles, which fill any slot as they are.
  bool reshapes_reserve() const noexcept {
    return reserved_pages_ > 0 && reserve_handle_pages_ > 1;
  }
  // The largest handles the reservation is made of (its pieces are smaller).
  size_t reserve_handle_pages() const noexcept { return reserve_handle_pages_; }
  // What the reservation asked for: above reserved_pages() when it was kept partial.
  size_t reserve_asked_pages() const noexcept { return reserve_asked_pages_; }
  // Reserved pages no live block touches: what the reservation holds beyond the live set (less
  // `untouched` touched pages, counted as free by the caller).
  size_t reserved_unused_pages(size_t untouched = 0) const noexcept {
    const size_t r = std::min(reserved_pages_, held_pages());
    // Registrable blocks' pages and retired handles' too: no block can have those.
    const size_t used = touched_pages_ - untouched + outside_pages_ + retired_pages_;
    return r > used ? r - used : 0;
  }
  struct ReserveOutcome {
    size_t asked = 0;     // pages
    size_t held_before = 0;
    size_t got = 0;       // pages reserved now
    bool whole = true;    // the driver gave all that was asked
  };
  // Makes the reservation `pages`. Growing creates handles of handle_pages pages (cut smaller
  // when the driver refuses one) into the pool until that many pages are held; when the driver
  // runs out first, partial keeps what it gave, otherwise every handle created here is released
  // and the reservation stays as it was (whole == false either way). Shrinking gives back what
  // the reservation no longer covers and no live block uses (pooled handles, then safe cached
  // memory). A driver failure other than out-of-memory releases what was created and throws.
  ReserveOutcome reserve(size_t pages, size_t handle_pages, bool partial);
  // Creates what the reservation lacks (up to `to` pages held; SIZE_MAX: the reservation) into
  // the pool: after reserve_may_dip let something release reserved pages before creating their
  // new shapes, and before a registrable block's handle goes. Best effort: stops at the first
  // refusal.
  void top_up(size_t to = SIZE_MAX) noexcept;
  // The promise: while a reservation is held (and reserve_may_dip is off) the held pages never
  // fall below it, inside a call or between calls. Every path that gives pages back asks first
  // whether releasing n of them (in_hand more are held outside the books: a request's) keeps it
  // whole; a replacement is created before what it replaces goes.
  bool guards_reserve() const noexcept { return reserved_pages_ > 0 && !opts_.reserve_may_dip; }
  bool may_release(size_t n, size_t in_hand = 0) const noexcept {
    return !guards_reserve() || held_pages() + in_hand >= reserved_pages_ + n;
  }
  // Pages that may be created beside what is held (in_hand more included), within the limit and
  // the device's capacity: the room a replacement is made in before what it replaces goes.
  // While the driver's refusals say another process holds that room (create_refused), none.
  size_t room(size_t in_hand = 0) const noexcept {
    if (create_refused()) return 0;
    const size_t cap = std::min(capacity_pages_, limit_pages_);
    const size_t used = held_pages() + in_hand;
    return cap > used ? cap - used : 0;
  }
  // The driver refused a cuMemCreate that the capacity, the limit and the held pages allowed:
  // another process holds that memory. For a while (asks_ counts requests for pages and refine
  // sweeps; the while doubles at each refusal, up to kRefusedWaitMax, and starts again short
  // after a create succeeds) reserved handles are not reshaped and a request the reservation
  // covers creates nothing: a neighbour holding the memory costs a failed call ever more rarely.
  bool create_refused() const noexcept { return asks_ < refused_until_; }
  void note_refused() noexcept {
    refused_until_ = asks_ + refused_wait_;
    refused_wait_ = std::min(refused_wait_ * 2, kRefusedWaitMax);
  }
  void note_created() noexcept { refused_wait_ = kRefusedWaitMin; }
  // Whether a handle of exactly `pages` pages is pooled, and takes it out of the books (the
  // caller holds it outside them: add_outside_pages).
  bool pooled_has(size_t pages) const { return pool_.has(pages); }
  CUmemGenericAllocationHandle take_pooled(size_t pages) { return pool_.take(pages); }
  // A handle held outside the page books (a registrable block's, unmapped) becomes a pooled one;
  // out of host memory it is released instead (errors swallowed).
  void keep_pooled(size_t pages, CUmemGenericAllocationHandle h) noexcept;
  // A handle no block may use again (exported: another process may map it still) that is not
  // released yet: the reservation needs its pages held until a replacement exists, or the driver
  // refused to release it. Its pages count as held; give_back_retired() lets it go.
  void retire(size_t pages, CUmemGenericAllocationHandle h) noexcept;
  size_t retired_pages() const noexcept { return retired_pages_; }
  // Releases retired handles: at once where the reservation (and `floor` pages) stays whole
  // without them, otherwise once a replacement of their size is created (room allowing). Best
  // effort; called by top_up() (its target the floor) and trim_to().
  void give_back_retired(size_t floor = 0) noexcept;
  // Releases pooled handles, none larger than what the held pages exceed the reservation by
  // (nor than what is left to shed), until `pages` are released or none fits; the pages released.
  size_t shed_pooled(size_t pages);
  // The corner of a reservation with no room to reshape (DeviceAllocator::place_whole_handles):
  // pooled handles, reclaimed from under safe free memory into the pool as needed, as few as
  // cover `pages` pages with the fewest spare: their sizes, largest first. Empty when the pool
  // and safe free memory hold fewer pages.
  std::vector<size_t> whole_handles_for(size_t pages);
  // Maps pooled handles of these sizes one after another from page `first` of r (unmapped), and
  // grants access to them. On a throw nothing is mapped for them and they are pooled.
  void map_whole(Reservation& r, size_t first, const std::vector<size_t>& sizes);

  // ---- supply ----
  // Maps and grants whatever [addr, addr+bytes) of r lacks (the block is carved, not yet live).
  // False when the pages cannot be had (req says what was tried; nothing is mapped for it).
  // max_handle_pages: the largest handle to map (0: AllocatorOptions::max_handle_size; a pool's
  // memory takes one-page handles, since nothing ever splits a live pool's handles).
  bool ensure_pages(Reservation& r, CUdeviceptr addr, size_t bytes, PageRequest& req,
                    size_t max_handle_pages = 0);
  // Unmaps about `want` pages of whole handles lying under safe free blocks into the pool.
  size_t reclaim(size_t want);
  // Unmaps exactly these handles (each wholly under safe free memory) and releases them, except
  // what the reservation keeps (pooled); the pages released.
  size_t give_back(std::vector<ReclaimableHandle> handles);
  // Releases pooled handles, then reclaims and releases cached ones, until at most max_held
  // pages are held (or nothing more can go), never below the reservation. Only safe free memory
  // is touched.
  // floor: the fewest pages to keep held (SIZE_MAX: the reservation); a registrable block about
  // to take pages of its own lets the reservation's pooled pages make room for them.
  void trim_to(size_t max_held, size_t floor = SIZE_MAX);
  // The one place pages get unmapped: the whole handles over pages [p, q) of r (one cuMemUnmap),
  // into the pool.
  void unmap_handles(Reservation& r, size_t p, size_t q);
  // Releases every pooled handle, errors swallowed (shutdown: the driver may be going away).
  void release_pool_quietly();  // the retired handles too

 private:
  using Filled = std::vector<std::pair<HandleSlot, CUmemGenericAllocationHandle>>;
  using Grants = std::vector<std::pair<size_t, size_t>>;  // (first page, pages)
  // What a block lacks: slots for its unmapped pages, `extra` slots for pages of split handles
  // outside it (covered again only if memory is at hand), and mapped handles to grant access to.
  struct Plan {
    std::vector<HandleSlot> slots, extra;
    Grants grant;
    bool split = false;  // a mapped handle was split for the block
  };
  class Gathering;  // page_gathering.cpp
  // Fills `open` slots with handles into `filled`: pool, creation, reclaim, release-and-create,
  // wait. What is left in `open` could not be had.
  void gather(std::vector<HandleSlot>& open, Filled& filled, PageRequest& req);

  Plan plan(Reservation& r, CUdeviceptr addr, size_t bytes, size_t max_pages);
  void split_handle(Reservation& r, size_t head, CUdeviceptr addr, size_t bytes, Plan& plan);
  void add_extra(const std::vector<HandleSlot>& extra, Filled& filled);
  // Cuts the multi-page handle h (under safe free memory) into one-page handles. False when a
  // reservation left no room to create them first (the driver refused one: another process holds
  // the memory), so nothing was cut.
  bool cut_to_pages(const ReclaimableHandle& h);
  void map_and_grant(Reservation& r, const Filled& filled, Grants grant);
  void put_back(const Filled& filled, size_t from = 0);
  // Unmaps the handles into the pool, one cuMemUnmap per run of adjacent ones.
  void unmap_into_pool(std::vector<ReclaimableHandle> take);
  // The one place a handle gets mapped: h (s.count pages) at page s.page of r, not yet
  // accessible.
  void map_handle(Reservation& r, const HandleSlot& s, CUmemGenericAllocationHandle h);
  // Whether a pooled handle of n pages is cheaper (by the cost model) to release and create
  // again inside a larger handle than to map on its own.
  bool exchange_pays(size_t n) const;
  // What releasing pooled handles of these sizes and creating their pages again as one handle of
  // k pages and power-of-two pieces of the rest costs by the cost model, less the k-page create
  // (the same whichever handles are released).
  double reshape_ns(const std::vector<size_t>& released, size_t k) const;
  // Creates `pages` pages as power-of-two handles into the pool, within room(); all or none
  // (what was made goes back when the driver refuses one).
  bool make_pieces(size_t pages);
  // Releases one pooled handle of `pages` pages (one must be pooled).
  void release_pooled(size_t pages);
  // Releases one pooled handle of the largest size (its pages; 0 when the pool is empty).
  size_t release_largest_pooled();

  DeviceDriver& drv_;
  Placement& placement_;
  StreamOrder& streams_;
  DeviceStats& stats_;
  const AllocatorOptions& opts_;
  size_t page_;
  size_t max_pages_;  // most pages per handle created (AllocatorOptions::max_handle_size)
  size_t capacity_pages_;
  size_t limit_pages_;
  HandlePool pool_;
  size_t mapped_pages_ = 0;
  size_t touched_pages_ = 0;
  size_t outside_pages_ = 0;
  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> retired_;  // (pages, handle)
  size_t retired_pages_ = 0;
  size_t high_water_ = 0;  // most pages touched by live blocks plus a request's, so far
  bool refine_ = false;       // see set_refine
  bool sweep_ = false;      // refining: multi-page handles may lie under free memory
  uint64_t sweeps_ = 0;     // refine_freed calls
  uint64_t next_sweep_ = 0;  // sweeps_ from which to look again (nothing could be cut)
  uint64_t asks_ = 0;  // gathers and refine sweeps: the clock of create_refused
  static constexpr uint64_t kRefusedWaitMin = 64;
  static constexpr uint64_t kRefusedWaitMax = uint64_t{1} << 16;
  uint64_t refused_wait_ = kRefusedWaitMin;
  uint64_t refused_until_ = 0;
  uint64_t asked_at_ = 0;   // sweeps_ when other streams' fences were asked
  // Refining: a pending block held multi-page handles; pending_seen_: StreamOrder's count of
  // blocks released from the pending list then (a change: look again).
  bool pending_coarse_ = false;
  uint64_t pending_seen_ = 0;
  size_t reserved_pages_ = 0;
  size_t reserve_asked_pages_ = 0;
  size_t reserve_handle_pages_ = 1;
  AllocatorEvents* events_ = nullptr;
};

}  // namespace expanse::core
