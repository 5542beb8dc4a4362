// Where blocks go: the VA reservations, carved into blocks at kBlockAlignment, the free index over
// them, and the choice of a free block (and an offset into it) for a request.
//
// The block is the best fit: the smallest free block the stream may use (docs/design.md, "How a
// request flows"), as PyTorch's allocator chooses, so that the layout, and the memory it holds,
// are no looser than expandable segments' whatever the handles under it. Within that block the
// placement may move to its end where that needs no driver call (ready_offset; nowhere else:
// places inside the block would leave holes a repeated layout does not have); elsewhere, page
// supply splits the free handles it covers in part.
#pragma once

#include "core/placement/block_index.hpp"
#include "core/device/device_driver.hpp"
#include "core/base/options.hpp"
#include "core/placement/reservation.hpp"
#include "core/base/device_stats.hpp"

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace expanse::core {

// Where a stream lately freed a block: a place to put the next block of the same size.
struct ReusePlace {
  CUdeviceptr addr;
  size_t size;  // as carved (a multiple of kBlockAlignment)
};

// A mapped handle that lies wholly inside a safe free block: its pages can be unmapped.
struct ReclaimableHandle {
  size_t pages;
  uint32_t res;
  size_t head;
};

class Placement {
 public:
  // How many free blocks (in size order) a pool's search of its own memory, and the small arena's
  // search for a ready place, inspect.
  static constexpr size_t kMappedSearchBudget = 32;

  Placement(DeviceDriver& drv, const AllocatorOptions& opts, size_t page, DeviceStats& stats)
      : drv_(drv), opts_(opts), page_(page), stats_(stats) {}
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  BlockIndex& index() noexcept { return index_; }
  const BlockIndex& index() const noexcept { return index_; }
  Reservation& res(uint32_t id) { return *reservations_[id]; }
  const Reservation& res(uint32_t id) const { return *reservations_[id]; }
  Arena arena_of(const Block& b) const { return res(b.res).arena; }
  Arena arena_for(size_t bytes) const noexcept {
    return bytes <= opts_.small_max ? Arena::small : Arena::large;
  }
  // f(r) for every reservation still held, in the order they were made.
  template <class F>
  void for_each_reservation(F&& f) {
    for (auto& rp : reservations_) {
      if (rp && rp->alive) f(*rp);
    }
  }
  template <class F>
  void for_each_reservation(F&& f) const {
    for (const auto& rp : reservations_) {
      if (rp && rp->alive) f(static_cast<const Reservation&>(*rp));
    }
  }
  size_t va_reserved() const noexcept { return va_reserved_; }
  size_t va_budget() const noexcept { return opts_.va_budget; }

  // The smallest free block `stream` may use, if a placement of sz bytes in it needs no driver
  // call (ready_offset); end() otherwise. In the small arena, the smallest of the first
  // kMappedSearchBudget in size order where one needs none.
  BlockIt find_ready(size_t sz, Arena a, StreamKey stream, size_t pages_left, size_t* offset);
  // The smallest free block `stream` may use that holds a placement of sz bytes touching at most
  // ceil(sz / page) new pages, under handles it holds or that can be split (HandleFit), among the
  // first `budget` in size order. whole_pages (sz a multiple of the page): the placement starts on
  // a page boundary, so that the block shares no page with another (a pool's memory is whole
  // pages). unproven: a split of memory whose work is not yet proven done counts as possible (the
  // caller proves it, or waits, before placing there).
  BlockIt find_tight(size_t sz, Arena a, StreamKey stream, size_t budget, size_t* offset,
                     bool whole_pages = false, bool unproven = false);
  // In pool p's own free memory: the smallest free block `stream` may use that holds a placement
  // of sz bytes whose pages are all mapped and accessible under handles that need no split (a
  // live pool's pages are never unmapped: a graph may address them), touching no more than
  // pages_left new pages; among the first kMappedSearchBudget in size order.
  BlockIt find_in_pool(size_t sz, Arena a, StreamKey stream, PoolSlot p, size_t pages_left,
                       size_t* offset);
  // A free block of the large arena's default pool that `stream` may use, holding `span` bytes
  // (whole pages) of which no page is mapped, and the offset of the first such place in it; among
  // the first kMappedSearchBudget in size order. end() when none.
  BlockIt find_unmapped(size_t span, StreamKey stream, size_t* offset);
  // A new reservation of arena a holding at least min_bytes (one free block), within the VA
  // budget; nullptr when the budget is spent.
  Reservation* add_reservation(Arena a, size_t min_bytes);
  // The exact-size hot path: a block of sz bytes at one of the places in `recent` (latest first;
  // the one used is dropped), if that memory is a free block of exactly sz bytes (one that merged
  // with its free neighbours is left to best fit: taking a piece of it would fragment it), usable
  // by `stream`, mapped, touches no more than pages_left new pages and needs no driver call.
  // Carved and marked live; end() otherwise.
  BlockIt reuse_recent(std::vector<ReusePlace>& recent, StreamKey stream, size_t sz, Arena a,
                       size_t pages_left, PoolSlot p = kDefaultPool);
  // A block of sz bytes at addr, if that memory is wholly free, of pool p and arena a, usable by
  // `stream`, mapped, touches no more than pages_left new pages (nor more than a fresh placement
  // would) and needs no driver call. Carved and marked live; end() otherwise.
  BlockIt place_at(CUdeviceptr addr, StreamKey stream, size_t sz, Arena a, size_t pages_left,
                   PoolSlot p = kDefaultPool);

  // Whether [c+off, c+off+sz) inside free block c can be used with the handles mapped there:
  // every multi-page handle over its pages lies inside its inner pages, or (splittable) can be
  // split first (it lies inside c's inner pages and c is safe; splittable_unproven: whether c is
  // safe or not). ready: also every page is mapped and accessible.
  enum class HandleFit { ready, splittable, splittable_unproven };
  bool handles_fit(BlockIt c, size_t off, size_t sz, HandleFit fit) const;
  // Whether every page of [c+off, c+off+sz) is mapped and accessible.
  bool mapped_at(BlockIt c, size_t off, size_t sz) const {
    const Reservation& r = res(c->second.res);
    return r.all_ready(r.first_page(c->first + off), r.last_page(c->first + off, sz));
  }
  // An offset into free block c for sz bytes that touches at most ceil(sz / page) new pages.
  // whole_pages: on the first page boundary inside c, always.
  bool tight_offset(BlockIt c, size_t sz, size_t* off, bool whole_pages = false) const;
  // An offset into free block c for sz bytes that needs no driver call and touches at most
  // ceil(sz / page) (and pages_left) new pages: the tight offset, else c's end.
  bool ready_offset(BlockIt c, size_t sz, size_t pages_left, size_t* off) const;

  // Every mapped handle lying wholly inside a safe free block's inner pages, of the default pool
  // (the only one whose pages others may take): large arena first, blocks largest first, handles
  // in address order.
  std::vector<ReclaimableHandle> reclaimable_handles();
  // The multi-page handles under free memory of the large arena's default pool: those under safe
  // free blocks (which can be unmapped now), largest blocks first; *owners: the streams whose
  // unsafe free blocks hold some too (unmapped once their work is proven done).
  std::vector<ReclaimableHandle> coarse_free_handles(std::vector<StreamKey>* owners);
  // Whether a multi-page handle lies in [addr, addr+bytes) of reservation `res`.
  bool holds_coarse(uint32_t res, CUdeviceptr addr, size_t bytes) const;
  // The mapped handles lying wholly inside free block it's inner pages, appended to out.
  void handles_under(BlockIt it, std::vector<ReclaimableHandle>& out) const;
  // Gives back (cuMemAddressFree) every reservation that holds no live block and no mapping.
  void release_empty_reservations();

  // Checks the tiling of every reservation by blocks, the coalescing of free blocks, the edge
  // counts, that live blocks are mapped and accessible under handles they may hold, and that
  // every mapped page belongs to one whole handle. "" or the first violation; *touched, *mapped
  // and *free_blocks get the pages touched and mapped and the free blocks, recounted.
  std::string check(size_t* touched, size_t* mapped, size_t* free_blocks) const;

 private:
  std::string check_reservation(const Reservation& r, size_t* touched, size_t* mapped,
                                size_t* free_blocks) const;
  std::string check_live_block(const Reservation& r, CUdeviceptr addr, const Block& b) const;

  DeviceDriver& drv_;
  const AllocatorOptions& opts_;
  size_t page_;
  DeviceStats& stats_;
  std::vector<std::unique_ptr<Reservation>> reservations_;
  BlockIndex index_;
  size_t va_reserved_ = 0;
};

}  // namespace expanse::core
