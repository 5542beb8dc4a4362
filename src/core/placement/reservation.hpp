// One VA reservation and the physical pages mapped under it.
//
// Pages (the device granularity, or page_size) are the unit of accounting. A page is "touched"
// while a live block overlaps it; only a block's first and last page can be shared with other
// blocks, so touched pages are counted exactly from per-page edge counts plus the interior pages
// of each block.
//
// A handle (one cuMemCreate) covers a run of pages of any length (see handle_plan.hpp); every page
// under it records the run's first page and length. cuMemMap maps a whole handle and cuMemUnmap
// never splits one, so a multi-page handle is mapped only where one live block covers it wholly
// (its inner pages): every page of a touched handle is touched, and the untouched pages
// docs/design.md, invariant 1 counts on can always be unmapped.
#pragma once

#include "core/base/check.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

enum class Arena : uint8_t { small = 0, large = 1 };
inline constexpr int kArenaCount = 2;

// A run of pages of one reservation: a mapped handle (whole, so it may reach outside the pages
// walked), or a run of unmapped pages (cut to the pages walked).
struct HandleRun {
  size_t head = 0;  // first page
  size_t pages = 0;
  bool mapped = false;
  size_t end() const noexcept { return head + pages; }
};

// Pages [lo, hi) of a reservation; empty when lo >= hi.
struct PageRange {
  size_t lo = 0;
  size_t hi = 0;
  // The handle lies inside these pages.
  bool holds(const HandleRun& h) const noexcept { return h.head >= lo && h.end() <= hi; }
  // A block whose inner pages these are may have h under it: h lies inside them, or is one page
  // (a block's edge page, which a neighbour may share, takes one-page handles only).
  bool admits(const HandleRun& h) const noexcept { return h.pages <= 1 || holds(h); }
};

struct Reservation;

// The runs over pages [p, q) of a reservation, in order: `for (const HandleRun& h :
// r.handles_in(p, q))` visits each mapped handle with a page in [p, q) once; runs_in() visits the
// unmapped runs between them too.
class HandleWalk {
 public:
  class iterator {
   public:
    iterator(const Reservation* r, size_t p, size_t q, bool gaps)
        : r_(r), p_(p), q_(q), gaps_(gaps) {
      settle();
    }
    const HandleRun& operator*() const noexcept { return run_; }
    const HandleRun* operator->() const noexcept { return &run_; }
    iterator& operator++() {
      p_ = run_.end();
      settle();
      return *this;
    }
    // Only against end(): whether the walk goes on.
    bool operator!=(const iterator&) const noexcept { return p_ < q_; }

   private:
    inline void settle();
    const Reservation* r_;
    size_t p_, q_;
    bool gaps_;
    HandleRun run_;
  };

  HandleWalk(const Reservation* r, size_t p, size_t q, bool gaps)
      : r_(r), p_(p), q_(q), gaps_(gaps) {}
  iterator begin() const { return iterator(r_, p_, q_, gaps_); }
  iterator end() const { return iterator(r_, q_, q_, gaps_); }

 private:
  const Reservation* r_;
  size_t p_, q_;
  bool gaps_;
};

struct Reservation {
  Reservation(uint32_t id_, Arena arena_, CUdeviceptr base_, size_t size_, size_t page_)
      : id(id_), arena(arena_), base(base_), size(size_), page(page_),
        handles(size_ / page_, 0), head(size_ / page_, 0), span(size_ / page_, 0),
        granted(size_ / page_, 0),
        edge_refs(size_ / page_, 0) {}

  uint32_t id;
  Arena arena;
  CUdeviceptr base;
  size_t size;
  size_t page;
  std::vector<CUmemGenericAllocationHandle> handles;  // per page: the handle over it; 0 = none
  std::vector<uint32_t> head;  // per mapped page: the first page of its handle
  std::vector<uint32_t> span;  // per mapped page: its handle's page count
  // Per page: cuMemSetAccess succeeded since it was mapped. A mapped page without access (left by
  // a failed undo) is not ready: the next block placed over it grants access first.
  std::vector<uint8_t> granted;
  std::vector<uint32_t> edge_refs;  // live blocks whose first or last page this is
  size_t mapped_pages = 0;
  size_t live_blocks = 0;
  bool alive = true;

  size_t page_count() const noexcept { return handles.size(); }
  size_t page_of(CUdeviceptr a) const noexcept { return static_cast<size_t>((a - base) / page); }
  CUdeviceptr page_addr(size_t i) const noexcept { return base + i * page; }
  bool mapped(size_t i) const noexcept { return handles[i] != 0; }
  // The handle over mapped page i: its first page and its page count.
  size_t handle_pages(size_t i) const noexcept { return span[i]; }
  size_t handle_head(size_t i) const noexcept { return head[i]; }
  HandleRun handle_at(size_t i) const noexcept { return {head[i], span[i], true}; }
  bool ready(size_t i) const noexcept { return handles[i] != 0 && granted[i] != 0; }
  bool contains(CUdeviceptr a) const noexcept { return a >= base && a - base < size; }

  // Mapped handles with a page in [p, q), each once, in order.
  HandleWalk handles_in(size_t p, size_t q) const { return HandleWalk(this, p, q, false); }
  // Mapped handles and runs of unmapped pages over [p, q), in order.
  HandleWalk runs_in(size_t p, size_t q) const { return HandleWalk(this, p, q, true); }

  // First and last page of [addr, addr+bytes), bytes > 0.
  size_t first_page(CUdeviceptr addr) const noexcept { return page_of(addr); }
  size_t last_page(CUdeviceptr addr, size_t bytes) const noexcept {
    return page_of(addr + bytes - 1);
  }
  // Every page of [first, last] mapped and accessible.
  bool all_ready(size_t first, size_t last) const noexcept {
    for (size_t i = first; i <= last; ++i) {
      if (!ready(i)) return false;
    }
    return true;
  }
  // No page of [first, first+n) mapped.
  bool none_mapped(size_t first, size_t n) const noexcept {
    for (size_t i = first; i < first + n; ++i) {
      if (mapped(i)) return false;
    }
    return true;
  }
  // Pages wholly inside [addr, addr+bytes).
  PageRange inner_pages(CUdeviceptr addr, size_t bytes) const noexcept {
    const size_t off = static_cast<size_t>(addr - base);
    return {(off + page - 1) / page, (off + bytes) / page};
  }
  // Pages of [addr, addr+bytes) that no live block touches. Only the first and last page can be
  // touched already (by neighbours); inner pages of a free range are touched by nobody.
  size_t untouched_pages(CUdeviceptr addr, size_t bytes) const noexcept {
    const size_t a = first_page(addr), z = last_page(addr, bytes);
    size_t n = z - a + 1;
    if (edge_refs[a] != 0) --n;
    if (z != a && edge_refs[z] != 0) --n;
    return n;
  }

  // Books a handle of `count` pages mapped at page `first`, not yet accessible.
  void note_mapped(size_t first, size_t count, CUmemGenericAllocationHandle h) noexcept {
    for (size_t p = first; p < first + count; ++p) {
      EXPANSE_ASSERT(!mapped(p));
      handles[p] = h;
      head[p] = static_cast<uint32_t>(first);
      span[p] = static_cast<uint32_t>(count);
      granted[p] = 0;
    }
    mapped_pages += count;
  }
  // Books pages [p, q) (mapped, whole handles) accessible.
  void note_granted(size_t p, size_t q) noexcept {
    for (size_t i = p; i < q; ++i) {
      EXPANSE_ASSERT(mapped(i));
      granted[i] = 1;
    }
  }
  // Books the handle h (mapped, whole) unmapped.
  void note_unmapped(const HandleRun& h) noexcept {
    EXPANSE_ASSERT(h.mapped && head[h.head] == h.head && span[h.head] == h.pages);
    for (size_t p = h.head; p < h.end(); ++p) {
      handles[p] = 0;
      head[p] = 0;
      span[p] = 0;
      granted[p] = 0;
    }
    mapped_pages -= h.pages;
  }

  // Marks [addr, addr+bytes) live; returns how many pages became touched.
  size_t touch(CUdeviceptr addr, size_t bytes) noexcept {
    size_t a = first_page(addr), b = last_page(addr, bytes);
    size_t added = (edge_refs[a]++ == 0) ? 1 : 0;
    if (b != a) {
      added += (edge_refs[b]++ == 0) ? 1 : 0;
      added += b - a - 1;
    }
    ++live_blocks;
    return added;
  }
  // Reverse of touch(); returns how many pages stopped being touched.
  size_t untouch(CUdeviceptr addr, size_t bytes) noexcept {
    size_t a = first_page(addr), b = last_page(addr, bytes);
    EXPANSE_ASSERT(edge_refs[a] > 0 && edge_refs[b] > 0 && live_blocks > 0);
    size_t removed = (--edge_refs[a] == 0) ? 1 : 0;
    if (b != a) {
      removed += (--edge_refs[b] == 0) ? 1 : 0;
      removed += b - a - 1;
    }
    --live_blocks;
    return removed;
  }
};

inline void HandleWalk::iterator::settle() {
  if (!gaps_) {
    while (p_ < q_ && !r_->mapped(p_)) ++p_;
  }
  if (p_ >= q_) return;
  if (r_->mapped(p_)) {
    run_ = r_->handle_at(p_);
    return;
  }
  size_t e = p_;
  while (e < q_ && !r_->mapped(e)) ++e;
  run_ = {p_, e - p_, false};
}

}  // namespace expanse::core
