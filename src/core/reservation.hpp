// One VA reservation and the physical pages mapped under it.
//
// Pages (the device granularity, or page_size) are the unit of accounting. A page is "touched"
// while a live block overlaps it; only a block's first and last page can be shared with other
// blocks, so touched pages are counted exactly from per-page edge counts plus the interior pages
// of each block.
//
// A handle (one cuMemCreate) covers a run of pages of any length (see handle_plan.hpp); every page
// under it records the run's first page and length. cuMemMap maps a whole handle and cuMemUnmap never
// splits one, so a multi-page handle is mapped only where one live block covers it wholly (its
// inner pages): every page of a touched handle is touched, and the untouched pages invariant 1
// counts on can always be unmapped.
#pragma once

#include <cuda.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

enum class Arena : uint8_t { small = 0, large = 1 };
inline constexpr int kArenaCount = 2;

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
  bool ready(size_t i) const noexcept { return handles[i] != 0 && granted[i] != 0; }
  bool contains(CUdeviceptr a) const noexcept { return a >= base && a - base < size; }

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
  // Pages wholly inside [addr, addr+bytes): [*lo, *hi). Empty when *lo >= *hi.
  void inner_pages(CUdeviceptr addr, size_t bytes, size_t* lo, size_t* hi) const noexcept {
    size_t off = static_cast<size_t>(addr - base);
    *lo = (off + page - 1) / page;
    *hi = (off + bytes) / page;
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
    assert(edge_refs[a] > 0 && edge_refs[b] > 0);
    size_t removed = (--edge_refs[a] == 0) ? 1 : 0;
    if (b != a) {
      removed += (--edge_refs[b] == 0) ? 1 : 0;
      removed += b - a - 1;
    }
    --live_blocks;
    return removed;
  }
};

}  // namespace expanse::core
