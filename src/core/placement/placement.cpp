#include "core/placement/placement.hpp"

#include "core/base/check.hpp"
#include "core/base/format.hpp"
#include "core/base/options.hpp"

#include <algorithm>
#include <sstream>

namespace expanse::core {

BlockIt Placement::find_ready(size_t sz, Arena a, StreamKey stream, size_t pages_left,
                              size_t* offset) {
  // The small arena's blocks share pages: a larger free block that needs nothing beats a
  // better fit that maps a page (its memory is not the large arena's layout question).
  const size_t budget = a == Arena::small ? kMappedSearchBudget : 1;
  return index_.first_fit_where(a, sz, stream, budget, [&](BlockIt c) {
    return ready_offset(c, sz, pages_left, offset);
  });
}

bool Placement::ready_offset(BlockIt c, size_t sz, size_t pages_left, size_t* off) const {
  const Block& cb = c->second;
  if (cb.size < sz) return false;
  const Reservation& r = res(cb.res);
  const size_t max_new = (sz + page_ - 1) / page_;
  const CUdeviceptr lo = c->first, hi = c->first + cb.size;
  auto fits = [&](CUdeviceptr x) {
    if (x < lo || x + sz > hi || (x - lo) % kBlockAlignment != 0) return false;
    const size_t fresh = r.untouched_pages(x, sz);
    if (fresh > max_new || fresh > pages_left) return false;
    if (!handles_fit(c, static_cast<size_t>(x - lo), sz, HandleFit::ready)) return false;
    *off = static_cast<size_t>(x - lo);
    return true;
  };
  size_t tight = 0;
  if (tight_offset(c, sz, &tight) && fits(lo + tight)) return true;
  return fits(hi - sz);
}

BlockIt Placement::find_tight(size_t sz, Arena a, StreamKey stream, size_t budget,
                              size_t* offset, bool whole_pages, bool unproven) {
  const HandleFit fit = unproven ? HandleFit::splittable_unproven : HandleFit::splittable;
  return index_.first_fit_where(a, sz, stream, budget, [&](BlockIt c) {
    size_t off = 0;
    if (!tight_offset(c, sz, &off, whole_pages) || !handles_fit(c, off, sz, fit)) return false;
    *offset = off;
    return true;
  });
}

BlockIt Placement::find_in_pool(size_t sz, Arena a, StreamKey stream, PoolSlot p,
                                size_t pages_left, size_t* offset) {
  return index_.first_fit_where(
      a, sz, stream, kMappedSearchBudget,
      [&](BlockIt c) {
        size_t off = 0;
        if (!tight_offset(c, sz, &off)) return false;
        const Reservation& r = res(c->second.res);
        if (r.untouched_pages(c->first + off, sz) > pages_left ||
            !handles_fit(c, off, sz, HandleFit::ready)) {
          return false;
        }
        *offset = off;
        return true;
      },
      p);
}

BlockIt Placement::reuse_recent(std::vector<ReusePlace>& recent, StreamKey stream, size_t sz,
                                Arena a, size_t pages_left, PoolSlot p) {
  for (size_t i = recent.size(); i-- > 0;) {
    const ReusePlace place = recent[i];
    if (place.size != sz) continue;
    auto c = index_.blocks().find(place.addr);
    if (c == index_.blocks().end() || c->second.size != sz) continue;
    BlockIt it = place_at(place.addr, stream, sz, a, pages_left, p);
    if (it == index_.end()) continue;
    recent.erase(recent.begin() + static_cast<std::ptrdiff_t>(i));
    return it;
  }
  return index_.end();
}

BlockIt Placement::place_at(CUdeviceptr addr, StreamKey stream, size_t sz, Arena a,
                            size_t pages_left, PoolSlot p) {
  // The free block around the place, if it is still wholly free.
  auto c = index_.blocks().upper_bound(addr);
  if (addr == 0 || c == index_.blocks().begin()) return index_.end();
  --c;
  const Block& cb = c->second;
  const Reservation& r = res(cb.res);
  if (cb.state != BlockState::free || cb.pool != p || r.arena != a ||
      addr + sz > c->first + cb.size) {
    return index_.end();
  }
  if (!cb.safe && cb.stream != stream) return index_.end();  // another stream's free memory
  // No more new pages than a fresh placement would touch (docs/design.md, invariant 1), and no
  // driver call.
  const size_t fresh = r.untouched_pages(addr, sz);
  const size_t off = static_cast<size_t>(addr - c->first);
  if (fresh > (sz + page_ - 1) / page_ || fresh > pages_left ||
      !handles_fit(c, off, sz, HandleFit::ready)) {
    return index_.end();
  }
  BlockIt it = index_.carve(c, sz, a, off);
  it->second.state = BlockState::live;
  return it;
}

// A placement of sz bytes inside free block c that needs at most ceil(sz / page) new pages
// (docs/design.md, invariant 1): at its start when the first page is shared with a live neighbour
// or the start is page-aligned, else on the first page boundary inside c. False when c cannot
// hold either.
//
// A block of k >= 2 whole pages also goes on the first page boundary when the k pages there are
// all unmapped and no more than its start would touch. At the start, inside a neighbour's page,
// it would end inside a page too: its pages would need two new handles (the inner run and a
// one-page handle for the last page, which the next block may share); on the boundary one
// handle of k pages backs it, and the blocks of whole pages after it stay aligned as well. A
// block of one page needs one new handle either way, and where the pages are mapped nothing is
// created either way, so there the start is kept: moving blocks off the start there only changes
// the layout (measured on cs336a_medium_128_train: 420 driver calls in pass 2 instead of 0, and
// 3 pages above PyTorch's reserved at the first pass's peak).
bool Placement::tight_offset(BlockIt c, size_t sz, size_t* off, bool whole_pages) const {
  const Reservation& r = res(c->second.res);
  const size_t rel = static_cast<size_t>(c->first - r.base);
  const size_t skip = round_up(rel, page_) - rel;
  const bool skip_fits = skip + sz <= c->second.size;
  const size_t max_new = (sz + page_ - 1) / page_;
  if (!whole_pages) {
    const size_t at_start = r.untouched_pages(c->first, sz);
    if (at_start <= max_new) {
      const size_t k = sz / page_;
      const bool align = skip != 0 && skip_fits && sz % page_ == 0 && k >= 2 && k <= at_start &&
                         r.none_mapped(r.page_of(c->first + skip), k);
      *off = align ? skip : 0;
      return true;
    }
  }
  if (!skip_fits) return false;
  *off = skip;
  return true;
}

bool Placement::handles_fit(BlockIt c, size_t off, size_t sz, HandleFit fit) const {
  const Reservation& r = res(c->second.res);
  const CUdeviceptr addr = c->first + off;
  const size_t first = r.first_page(addr), last = r.last_page(addr, sz);
  const bool need_ready = fit == HandleFit::ready;
  const PageRange inner = r.inner_pages(addr, sz);
  const PageRange free_inner = r.inner_pages(c->first, c->second.size);
  // One step per handle, not per page: exact-size reuse asks this on every cached allocate. A
  // handle's pages are granted access together, so its first page here answers for all.
  for (const HandleRun& h : r.runs_in(first, last + 1)) {
    if (!h.mapped) {
      if (need_ready) return false;
      continue;
    }
    if (need_ready && !r.ready(std::max(h.head, first))) return false;
    if (inner.admits(h)) continue;
    // A multi-page handle the block would cover in part, or on an edge page it shares.
    if (fit == HandleFit::ready || (fit == HandleFit::splittable && !c->second.safe) ||
        !free_inner.holds(h)) {
      return false;
    }
  }
  return true;
}

BlockIt Placement::find_unmapped(size_t span, StreamKey stream, size_t* offset) {
  const size_t n = span / page_;
  return index_.first_fit_where(Arena::large, span, stream, kMappedSearchBudget, [&](BlockIt it) {
    const Reservation& r = res(it->second.res);
    const PageRange inner = r.inner_pages(it->first, it->second.size);
    size_t run = 0;
    for (size_t p = inner.lo; p < inner.hi; ++p) {
      run = r.mapped(p) ? 0 : run + 1;
      if (run == n) {
        *offset = r.page_addr(p + 1 - n) - it->first;
        return true;
      }
    }
    return false;
  });
}

Reservation* Placement::add_reservation(Arena a, size_t min_bytes) {
  size_t size = a == Arena::small ? opts_.small_va_size : opts_.va_size;
  size = std::max(size, round_up(min_bytes, page_));
  if (va_reserved_ + size > opts_.va_budget) {
    if (va_reserved_ + round_up(min_bytes, page_) > opts_.va_budget) return nullptr;
    size = round_up(min_bytes, page_);
  }
  CUdeviceptr base = drv_.reserve(size, page_);
  auto id = static_cast<uint32_t>(reservations_.size());
  reservations_.push_back(std::make_unique<Reservation>(id, a, base, size, page_));
  index_.add_reservation(*reservations_.back());
  va_reserved_ += size;
  stats_.peak_va_reserved_bytes = std::max<uint64_t>(stats_.peak_va_reserved_bytes, va_reserved_);
  return reservations_.back().get();
}

std::vector<ReclaimableHandle> Placement::reclaimable_handles() {
  std::vector<ReclaimableHandle> out;
  for (Arena a : {Arena::large, Arena::small}) {
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      handles_under(it, out);
      return true;
    });
  }
  return out;
}

std::vector<ReclaimableHandle> Placement::coarse_free_handles(std::vector<StreamKey>* owners) {
  std::vector<ReclaimableHandle> out;
  index_.for_each_safe_largest_first(Arena::large, [&](BlockIt it) {
    const size_t before = out.size();
    handles_under(it, out);
    out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(before), out.end(),
                             [](const ReclaimableHandle& h) { return h.pages <= 1; }),
              out.end());
    return true;
  });
  owners->clear();
  index_.for_each_unsafe(Arena::large, [&](BlockIt it) {
    const StreamKey k = it->second.stream;
    if (std::find(owners->begin(), owners->end(), k) == owners->end() &&
        holds_coarse(it->second.res, it->first, it->second.size)) {
      owners->push_back(k);
    }
    return true;
  });
  return out;
}

bool Placement::holds_coarse(uint32_t res, CUdeviceptr addr, size_t bytes) const {
  const Reservation& r = this->res(res);
  const PageRange inner = r.inner_pages(addr, bytes);
  for (const HandleRun& h : r.handles_in(inner.lo, inner.hi)) {
    if (h.pages > 1 && inner.holds(h)) return true;
  }
  return false;
}

void Placement::handles_under(BlockIt it, std::vector<ReclaimableHandle>& out) const {
  const Reservation& r = res(it->second.res);
  const PageRange inner = r.inner_pages(it->first, it->second.size);
  for (const HandleRun& h : r.handles_in(inner.lo, inner.hi)) {
    if (inner.holds(h)) out.push_back({h.pages, r.id, h.head});
  }
}

void Placement::release_empty_reservations() {
  for (auto& rp : reservations_) {
    if (!rp || !rp->alive || rp->live_blocks != 0 || rp->mapped_pages != 0) continue;
    auto it = index_.blocks().find(rp->base);
    // A pool's free memory keeps its addresses (an asleep pool's graphs replay into them).
    if (it == index_.blocks().end() || it->second.size != rp->size ||
        it->second.state != BlockState::free || !it->second.safe ||
        it->second.pool != kDefaultPool) {
      continue;
    }
    drv_.address_free(rp->base, rp->size);
    index_.remove_reservation(*rp);
    EXPANSE_ASSERT(va_reserved_ >= rp->size);
    va_reserved_ -= rp->size;
    rp->alive = false;
  }
}

// ---- the books' check -----------------------------------------------------------------------

std::string Placement::check(size_t* touched, size_t* mapped, size_t* free_blocks) const {
  *touched = 0;
  *mapped = 0;
  *free_blocks = 0;
  for (const auto& rp : reservations_) {
    if (!rp || !rp->alive) continue;
    std::string err = check_reservation(*rp, touched, mapped, free_blocks);
    if (!err.empty()) return err;
  }
  return "";
}

std::string Placement::check_reservation(const Reservation& r, size_t* touched, size_t* mapped,
                                         size_t* free_blocks) const {
  std::ostringstream err;
  const auto& blocks = index_.blocks();
  std::vector<uint32_t> edges(r.page_count(), 0);
  std::vector<char> interior(r.page_count(), 0);
  CUdeviceptr at = r.base;
  auto it = blocks.find(r.base);
  const Block* prev = nullptr;
  while (at < r.base + r.size) {
    if (it == blocks.end() || it->first != at) {
      err << "reservation " << hex(r.base) << ": no block at " << hex(at);
      return err.str();
    }
    const Block& b = it->second;
    if (b.res != r.id || b.size == 0 || b.size % kBlockAlignment != 0) {
      err << "block " << hex(it->first) << " has bad size or reservation";
      return err.str();
    }
    if (b.state == BlockState::free) {
      ++*free_blocks;
      if (prev != nullptr && index_.mergeable(*prev, b)) {
        err << "free blocks at " << hex(it->first) << " and before it were not coalesced";
        return err.str();
      }
    }
    if (b.state == BlockState::live) {
      const size_t a = r.first_page(it->first), z = r.last_page(it->first, b.size);
      ++edges[a];
      if (z != a) ++edges[z];
      for (size_t p = a + 1; p < z; ++p) interior[p] = 1;
      std::string bad = check_live_block(r, it->first, b);
      if (!bad.empty()) return bad;
    }
    prev = &b;
    at += b.size;
    ++it;
  }
  for (size_t p = 0; p < r.page_count(); ++p) {
    if (edges[p] != r.edge_refs[p]) {
      err << "reservation " << hex(r.base) << " page " << p << ": edge count " << r.edge_refs[p]
          << ", expected " << edges[p];
      return err.str();
    }
    if (edges[p] != 0 || interior[p] != 0) ++*touched;
    if (!r.mapped(p)) continue;
    ++*mapped;
    const size_t head = r.handle_head(p);
    if (head + r.handle_pages(p) > r.page_count() || r.handles[head] != r.handles[p] ||
        r.span[head] != r.span[p] || r.head[head] != head || r.granted[head] != r.granted[p]) {
      err << "reservation " << hex(r.base) << " page " << p << ": not part of one whole "
          << r.handle_pages(p) << "-page handle";
      return err.str();
    }
  }
  return "";
}

// A live block's pages are mapped and accessible, under handles it may hold.
std::string Placement::check_live_block(const Reservation& r, CUdeviceptr addr,
                                        const Block& b) const {
  const size_t a = r.first_page(addr), z = r.last_page(addr, b.size);
  const PageRange inner = r.inner_pages(addr, b.size);
  std::ostringstream err;
  for (const HandleRun& h : r.runs_in(a, z + 1)) {
    const size_t p = std::max(h.head, a);  // the run's first page inside the block
    if (!h.mapped || !r.ready(p)) {
      err << "live block " << hex(addr) << " has an unmapped or inaccessible page " << p;
      return err.str();
    }
    if (!inner.admits(h)) {
      err << "live block " << hex(addr) << " covers part of the " << h.pages
          << "-page handle at page " << h.head << " (or shares it on an edge page)";
      return err.str();
    }
  }
  return "";
}

}  // namespace expanse::core
