// Which handles back a run of pages: the handle sizes expanse creates and maps.
//
// Driver calls cost mostly per call (reference/driver_costs.md: on an H100 a 112 MiB handle costs
// about 2x a 2 MiB one to create, set access on, unmap and release), so a block's inner pages (the
// pages wholly inside it) are backed by few large handles: power-of-two page counts, aligned to
// their size in page index, up to a maximum (1 GiB by default). A block's first and last page may
// be shared with its neighbours and get one-page handles, so a multi-page handle is only ever
// touched by the one block it lies in (reservation.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

// Orders (log2 pages) of handles expanse may hold: at most 2^31 pages per handle.
inline constexpr unsigned kHandleOrders = 32;

struct HandleSlot {
  size_t page = 0;    // first page, aligned to 2^order
  unsigned order = 0;  // 2^order pages
  size_t pages() const noexcept { return size_t{1} << order; }
};

// Largest order whose handle is at most max_bytes (at least 0).
inline unsigned max_handle_order(size_t page, size_t max_bytes) noexcept {
  unsigned o = 0;
  while (o + 1 < kHandleOrders && (page << (o + 1)) <= max_bytes && (page << (o + 1)) > page) ++o;
  return o;
}

// Appends slots tiling the pages [s, e): pages inside [lo, hi) in the largest aligned
// power-of-two pieces of at most 2^max_order pages, every other page alone.
inline void plan_handles(size_t s, size_t e, size_t lo, size_t hi, unsigned max_order,
                         std::vector<HandleSlot>& out) {
  while (s < e) {
    if (s < lo || s >= hi) {
      out.push_back({s, 0});
      ++s;
      continue;
    }
    const size_t end = e < hi ? e : hi;
    unsigned o = 0;
    while (o < max_order && (s & ((size_t{2} << o) - 1)) == 0 && s + (size_t{2} << o) <= end) ++o;
    out.push_back({s, o});
    s += size_t{1} << o;
  }
}

}  // namespace expanse::core
