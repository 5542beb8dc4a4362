// Which handles back a run of pages: the handle sizes expanse creates and maps.
//
// Driver calls cost mostly per call (measured on an H100: a 112 MiB handle costs about 2x a 2 MiB
// one to create, set access on, unmap and release), and cuMemSetAccess over a
// range is priced per mapping, so a block's inner pages (the pages wholly inside it) are backed by
// as few handles as possible: one handle per unmapped run of them, of exactly the run's size, cut
// into pieces of at most max_handle_size (1 GiB by default). A block's first and last page may be
// shared with its neighbours and get one-page handles, so a multi-page handle is only ever
// touched by the one block it lies in (reservation.hpp).
//
// Measured on cs336b_ctx128_fullstep (first pass, default 80 GiB device): power-of-two handles
// aligned to their size made 5,372 cuMemCreate (0.52 s modeled); one handle per run makes less
// than half as many.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

struct HandleSlot {
  size_t page = 0;   // first page
  size_t count = 0;  // pages
  size_t pages() const noexcept { return count; }
};

// Most pages in one handle: max_bytes / page, at least 1, at most 2^31 (the per-page books are
// 32-bit).
inline size_t max_handle_pages(size_t page, size_t max_bytes) noexcept {
  size_t n = page == 0 ? 1 : max_bytes / page;
  if (n == 0) n = 1;
  if (n > (size_t{1} << 31)) n = size_t{1} << 31;
  return n;
}

// Appends slots tiling the pages [s, e): pages inside [lo, hi) in runs of at most max_pages pages
// (the last piece takes the remainder), every other page alone.
inline void plan_handles(size_t s, size_t e, size_t lo, size_t hi, size_t max_pages,
                         std::vector<HandleSlot>& out) {
  while (s < e) {
    if (s < lo || s >= hi) {
      out.push_back({s, 1});
      ++s;
      continue;
    }
    const size_t end = e < hi ? e : hi;
    const size_t n = end - s < max_pages ? end - s : max_pages;
    out.push_back({s, n});
    s += n;
  }
}

// How many blocks plan_handles_periodic predicts: enough for a freed block refilled by a few of
// another size (cs336b: 98 MiB blocks refilled by four of 24.5 MiB), few enough that a wrong guess
// costs at most ~2 x 8 small handles more than one remainder handle would (a block of one page
// and a bit at the start of a freed 1 GiB handle cut all 512 pages into one-page handles when
// every block was predicted: 47 ms modeled instead of 1.4).
constexpr size_t kPredictedBlocks = 8;

// Appends slots tiling the pages [s, e) as if kPredictedBlocks blocks of `bytes` followed, back
// to back, a block starting `off0` bytes into page `first`: each page where one of them would
// begin or end inside the page gets a handle alone (a later block there shares it with its
// neighbour), the pages between get runs of at most max_pages, and the pages past the last
// predicted block are planned as plan_handles does. A freed large block is usually refilled by
// several blocks of one size (a layer's activations), and cutting the rest of its handle where
// they will fall splits it once instead of once per block. Blocks smaller than a page tile as
// plan_handles does.
inline void plan_handles_periodic(size_t s, size_t e, size_t first, size_t off0, size_t bytes,
                                  size_t page, size_t max_pages, std::vector<HandleSlot>& out) {
  if (bytes < page || s >= e) {
    plan_handles(s, e, s, e, max_pages, out);
    return;
  }
  // Block k (k >= 1 after the placed one) spans [off0 + k * bytes, off0 + (k + 1) * bytes) from
  // page `first`; the cuts are the starts of blocks 1 .. kPredictedBlocks + 1.
  const size_t from = (s - first) * page;  // byte offset of page s from page `first`
  size_t k = from > off0 ? (from - off0 + bytes - 1) / bytes : 1;
  if (k == 0) k = 1;
  while (s < e && k <= kPredictedBlocks + 1) {
    const size_t pos = off0 + k * bytes;
    const size_t pk = first + pos / page;
    const size_t cut = pk < e ? pk : e;
    if (cut > s) {
      plan_handles(s, cut, s, cut, max_pages, out);
      s = cut;
    }
    if (s < e && pk == s && pos % page != 0) {
      out.push_back({s, 1});
      ++s;
    }
    ++k;
  }
  if (s < e) plan_handles(s, e, s, e, max_pages, out);
}

}  // namespace expanse::core
