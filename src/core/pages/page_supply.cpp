#include "core/pages/page_supply.hpp"

#include "core/base/check.hpp"
#include "driver_api/cost_model.hpp"

#include <algorithm>

namespace expanse::core {

PageSupply::PageSupply(DeviceDriver& drv, Placement& placement, StreamOrder& streams,
                       DeviceStats& stats, const AllocatorOptions& opts, size_t page)
    : drv_(drv), placement_(placement), streams_(streams), stats_(stats), opts_(opts),
      page_(page), max_pages_(max_handle_pages(page, opts.max_handle_size)),
      capacity_pages_(drv.total_memory() / page),
      limit_pages_(opts.limit == kNoLimit ? SIZE_MAX : opts.limit / page) {}

// ---- mapping and the pool -------------------------------------------------------------------

void PageSupply::map_handle(Reservation& r, const HandleSlot& s, CUmemGenericAllocationHandle h) {
  drv_.map(r.page_addr(s.page), s.pages() * page_, h);
  if (events_ != nullptr) events_->on_map(drv_.device(), r.page_addr(s.page), s.pages() * page_);
  r.note_mapped(s.page, s.count, h);
  mapped_pages_ += s.pages();
}

void PageSupply::unmap_handles(Reservation& r, size_t p, size_t q) {
  EXPANSE_ASSERT(p < q && r.mapped(p) && r.handle_head(p) == p);
  size_t n = 0;
  for ([[maybe_unused]] const HandleRun& h : r.handles_in(p, q)) {
    EXPANSE_ASSERT(h.end() <= q);
    ++n;
  }
  // Into the pool before the driver unmaps them (putting may need host memory, taking back does
  // not): out of host memory, or refused by the driver, they come out again and nothing changed.
  size_t put = 0;
  try {
    for (const HandleRun& h : r.handles_in(p, q)) {
      pool_.put(h.pages, r.handles[h.head]);
      ++put;
    }
    drv_.unmap(r.page_addr(p), (q - p) * page_, n);
  } catch (...) {
    // The pool gives back, per size, the handles put last: these.
    for (const HandleRun& h : r.handles_in(p, q)) {
      if (put-- == 0) break;
      pool_.take(h.pages);
    }
    throw;
  }
  if (events_ != nullptr) events_->on_unmap(drv_.device(), r.page_addr(p), (q - p) * page_);
  for (const HandleRun& h : r.handles_in(p, q)) r.note_unmapped(h);
  EXPANSE_ASSERT(mapped_pages_ >= q - p);
  mapped_pages_ -= q - p;
}

void PageSupply::release_pooled(size_t pages) {
  // Out of the pool only once the driver took it: a failed release leaves the books as they were.
  drv_.release(pool_.peek(pages), pages * page_);
  pool_.take(pages);
  stats_.num_released_pages += pages;
}

size_t PageSupply::release_largest_pooled() {
  if (pool_.empty()) return 0;
  const size_t n = pool_.largest();
  release_pooled(n);
  return n;
}

void PageSupply::keep_pooled(size_t pages, CUmemGenericAllocationHandle h) noexcept {
  try {
    pool_.put(pages, h);
  } catch (...) {
    try {
      drv_.release(h, pages * page_);
      stats_.num_released_pages += pages;
    } catch (...) {
    }
  }
}

void PageSupply::release_pool_quietly() {
  pool_.for_each([&](size_t n, CUmemGenericAllocationHandle h) {
    try {
      drv_.release(h, n * page_);
    } catch (...) {
    }
  });
  for (const auto& [n, h] : retired_) {
    try {
      drv_.release(h, n * page_);
    } catch (...) {
    }
  }
  retired_.clear();
  retired_pages_ = 0;
}

void PageSupply::put_back(const Filled& filled, size_t from) {
  for (size_t i = from; i < filled.size(); ++i) pool_.put(filled[i].first.count, filled[i].second);
}

// Whether releasing a pooled handle of n pages and creating its pages as part of a larger
// handle costs less by the cost model than mapping it as a handle of its own (its cuMemMap and
// its mapping's share of cuMemSetAccess). Per-byte parts paid either way cancel.
bool PageSupply::exchange_pays(size_t n) const {
  const driver::CostModel& m = driver::CostModel::get_default();
  using driver::EntryPoint;
  const size_t b = page_ * n;
  auto per_byte = [&](EntryPoint e) { return m.cost_ns(e, b) - m.cost_ns(e, 0); };
  const double remap = m.cost_ns(EntryPoint::mem_map, b) + m.cost_ns(EntryPoint::mem_set_access, b);
  const double swap = m.cost_ns(EntryPoint::mem_release, b) + per_byte(EntryPoint::mem_create) +
                      per_byte(EntryPoint::mem_map) + per_byte(EntryPoint::mem_set_access);
  return swap < remap;
}

double PageSupply::reshape_ns(const std::vector<size_t>& released, size_t k) const {
  const driver::CostModel& m = driver::CostModel::get_default();
  using driver::EntryPoint;
  double ns = 0;
  size_t pages = 0;
  for (size_t n : released) {
    ns += m.cost_ns(EntryPoint::mem_release, n * page_);
    pages += n;
  }
  for (size_t rest = pages > k ? pages - k : 0; rest != 0; rest &= rest - 1) {
    ns += m.cost_ns(EntryPoint::mem_create, (rest & ~(rest - 1)) * page_);
  }
  return ns;
}

void PageSupply::note_peaks(size_t in_hand) {
  stats_.peak_mapped_bytes =
      std::max<uint64_t>(stats_.peak_mapped_bytes, (mapped_pages_ + outside_pages_) * page_);
  stats_.peak_physical_bytes =
      std::max<uint64_t>(stats_.peak_physical_bytes, (held_pages() + in_hand) * page_);
}

// ---- a block's pages --------------------------------------------------------------------------

bool PageSupply::ensure_pages(Reservation& r, CUdeviceptr addr, size_t bytes, PageRequest& req,
                              size_t max_handle_pages) {
  // A split or an exchange may have released reserved pages to reshape them: created again.
  struct TopUp {
    PageSupply& s;
    ~TopUp() {
      if (s.held_pages() < s.reserved_pages_) s.top_up();
    }
  } top_up_after{*this};
  Plan p = plan(r, addr, bytes, max_handle_pages != 0 ? max_handle_pages : max_pages_);
  if (p.slots.empty() && p.grant.empty() && p.extra.empty()) return true;
  for (const HandleSlot& s : p.slots) req.needed += s.pages();

  Filled filled;
  std::vector<HandleSlot> open = p.slots;
  try {
    gather(open, filled, req);
  } catch (...) {
    put_back(filled);
    throw;
  }
  if (!open.empty()) {
    put_back(filled);
    return false;
  }
  try {
    add_extra(p.extra, filled);
  } catch (...) {
    put_back(filled);
    throw;
  }
  map_and_grant(r, filled, std::move(p.grant));
  // The block's pages are mapped and accessible, under handles it may hold.
  EXPANSE_ASSERT(r.all_ready(r.first_page(addr), r.last_page(addr, bytes)));
  return true;
}

void PageSupply::refine_freed(StreamKey stream) {
  const uint64_t now = ++sweeps_;
  if (!refine_) return;
  ++asks_;
  if (!sweep_ && pending_coarse_ && streams_.pending_released() != pending_seen_) {
    // A block that waited for other streams, large handles and all, may be free now.
    sweep_ = true;
    pending_coarse_ = streams_.has_pending();
    pending_seen_ = streams_.pending_released();
  }
  if (!sweep_ || now < next_sweep_) return;
  std::vector<ReclaimableHandle> handles;
  std::vector<StreamKey> owners;
  try {
    handles = placement_.coarse_free_handles(&owners);
    bool proved = false;
    if (std::find(owners.begin(), owners.end(), stream) != owners.end()) {
      proved = streams_.prove_own(stream);
    }
    if (owners.size() > (proved ? 1u : 0u) && now >= asked_at_ + kRefineAskEvery) {
      streams_.poll(false);
      asked_at_ = now;
      proved = true;
    }
    if (proved) handles = placement_.coarse_free_handles(&owners);
  } catch (...) {
    return;
  }
  size_t done = 0;
  size_t i = 0;
  for (; i < handles.size() && (done == 0 || done + handles[i].pages <= kRefinePagesPerCall);
       ++i) {
    if (!cut_to_pages(handles[i])) {
      // No room to create the pages first: look again later (create_refused says when the
      // driver may be asked again).
      next_sweep_ = now + kRefineAskEvery;
      sweep_ = true;
      return;
    }
    done += handles[i].pages;
  }
  sweep_ = !owners.empty() || i < handles.size();
  // Nothing to cut now, only memory no fence proves yet (a capture under way, another thread's
  // stream): look again after kRefineAskEvery calls, not at every one.
  if (sweep_ && handles.empty()) next_sweep_ = now + kRefineAskEvery;
  // The cut released reserved pages before creating them again: what it could not create is
  // created again into the pool (nothing is given back while the reservation holds it).
  if (held_pages() < reserved_pages_) top_up();
}

bool PageSupply::cut_to_pages(const ReclaimableHandle& h) {
  Reservation& r = placement_.res(h.res);
  Filled filled;
  // Under a reservation its one-page handles are created before it goes (room beyond the held
  // pages, or nothing is cut): the held pages never dip below the reservation.
  const bool first = !may_release(h.pages);
  auto release_made = [&] {  // each once, even when a put throws midway
    while (!filled.empty()) {
      const CUmemGenericAllocationHandle one = filled.back().second;
      filled.pop_back();
      try {
        drv_.release(one, page_);
        ++stats_.num_released_pages;
      } catch (...) {
        pool_.put(1, one);  // kept: the books match the driver
      }
    }
  };
  try {
    filled.reserve(h.pages);
    if (first) {
      if (room() < h.pages) return false;
      for (size_t p = h.head; p < h.head + h.pages; ++p) {
        CUmemGenericAllocationHandle one = 0;
        if (drv_.create(page_, &one) != CUDA_SUCCESS) {
          note_refused();
          break;
        }
        note_created();
        ++stats_.num_created_pages;
        filled.emplace_back(HandleSlot{p, 1}, one);  // reserved: does not throw
      }
      if (filled.size() < h.pages) {
        release_made();
        return false;
      }
      note_peaks(filled.size());
    }
    unmap_handles(r, h.head, h.head + h.pages);
    if (!first) release_pooled(h.pages);
  } catch (...) {
    try {
      release_made();
    } catch (...) {
    }
    return true;  // not for lack of room: the next handle may be cut
  }
  for (size_t p = h.head; !first && p < h.head + h.pages; ++p) {
    if (held_pages() + filled.size() + 1 > std::min(limit_pages_, capacity_pages_)) break;
    CUmemGenericAllocationHandle one = 0;
    try {
      if (drv_.create(page_, &one) != CUDA_SUCCESS) break;  // out of memory: the rest too
    } catch (...) {
      continue;  // a refused page stays unmapped (free memory); the next may be created
    }
    ++stats_.num_created_pages;
    filled.emplace_back(HandleSlot{p, 1}, one);  // reserved: does not throw
  }
  try {
    map_and_grant(r, filled, {});  // on a failure its handles go to the pool
  } catch (...) {
  }
  if (first) {
    try {
      release_pooled(h.pages);  // its pages exist again, one page a handle
    } catch (...) {
    }
  }
  return true;
}

// What the block lacks: unmapped runs get handles planned for it; mapped handles without access
// get it. A multi-page handle reaching outside the block's inner pages (free and safe: placement
// checked) is split: unmapped, released, and replaced by handles that each lie inside it, so
// handles only ever get finer where blocks' boundaries fall and a repeated workload settles into
// finding everything mapped.
PageSupply::Plan PageSupply::plan(Reservation& r, CUdeviceptr addr, size_t bytes,
                                  size_t max_pages) {
  const size_t first = r.first_page(addr), last = r.last_page(addr, bytes);
  const PageRange inner = r.inner_pages(addr, bytes);
  Plan out;
  std::vector<size_t> split;  // heads of handles to split
  for (const HandleRun& h : r.runs_in(first, last + 1)) {
    if (!h.mapped) {
      plan_handles(h.head, h.end(), inner.lo, inner.hi, max_pages, out.slots);
    } else if (!inner.admits(h)) {
      split.push_back(h.head);
    } else if (!r.ready(std::max(h.head, first))) {
      out.grant.emplace_back(h.head, h.pages);
    }
  }
  for (size_t head : split) split_handle(r, head, addr, bytes, out);
  out.split = !split.empty();
  return out;
}

// Splits the free handle at `head` that the block [addr, addr+bytes) covers in part. Its pages
// outside the block are covered again only if memory is at hand (`extra`); those after the block
// are cut where more blocks of its size would fall (plan_handles_periodic), so a freed block
// refilled by smaller ones of one size is split once, not once per block (on
// cs336b_ctx128_fullstep: 481 splits -> 284).
void PageSupply::split_handle(Reservation& r, size_t head, CUdeviceptr addr, size_t bytes,
                              Plan& out) {
  const size_t first = r.first_page(addr), last = r.last_page(addr, bytes);
  const PageRange inner = r.inner_pages(addr, bytes);
  const size_t n = r.handle_pages(head);
  unmap_handles(r, head, head + n);
  // Under a reservation it stays pooled until its pages exist in their new shapes (from_reserve
  // creates them first, then releases it): the reservation never dips.
  if (may_release(n)) release_pooled(n);
  const size_t a = std::max(head, first), z = std::min(head + n, last + 1);
  if (refine_) {  // one-page handles: the pieces inside the block too, since it will go
    if (head < a) plan_handles(head, a, head, a, 1, out.extra);
    plan_handles(a, z, a, z, 1, out.slots);
    if (z < head + n) plan_handles(z, head + n, z, head + n, 1, out.extra);
    return;
  }
  if (head < a) plan_handles(head, a, head, a, max_pages_, out.extra);
  plan_handles(a, z, std::max(inner.lo, a), std::min(inner.hi, z), max_pages_, out.slots);
  if (z < head + n) {
    plan_handles_periodic(z, head + n, first, addr - r.page_addr(first), bytes, page_, max_pages_,
                          out.extra);
  }
}

// Extra slots are filled from the pool, or created within the device and the limit; the rest
// stay unmapped. With a reservation, what it lacks (the split released it) is created in their
// shapes; beyond that smaller pooled handles fill them piece by piece and nothing is created: the
// reservation's pages serve them, and unmapped pages cost nothing.
void PageSupply::add_extra(const std::vector<HandleSlot>& extra, Filled& filled) {
  size_t in_hand = 0;
  for (const auto& f : filled) in_hand += f.first.pages();
  std::vector<HandleSlot> open(extra.rbegin(), extra.rend());
  while (!open.empty()) {
    HandleSlot s = open.back();
    open.pop_back();
    CUmemGenericAllocationHandle h = 0;
    if (pool_.has(s.count)) {
      h = pool_.take(s.count);
    } else if (reshapes_reserve() && held_pages() + in_hand + s.pages() <= reserved_pages_ &&
               drv_.create(s.pages() * page_, &h) == CUDA_SUCCESS) {
      stats_.num_created_pages += s.pages();  // reserved pages a split released, in their shape
    } else if (reserved_pages_ > 0) {
      const size_t n = pool_.largest_below(s.count);
      if (n == 0) continue;
      open.push_back({s.page + n, s.count - n});
      s.count = n;
      h = pool_.take(n);
    } else if (held_pages() + in_hand + s.pages() > std::min(limit_pages_, capacity_pages_) ||
               drv_.create(s.pages() * page_, &h) != CUDA_SUCCESS) {
      continue;
    } else {
      stats_.num_created_pages += s.pages();
    }
    filled.emplace_back(s, h);
    in_hand += s.pages();
    note_peaks(in_hand);
  }
}

// Maps each handle, then grants access run by run (one cuMemSetAccess per contiguous run). On a
// failure this call's mappings are undone; a handle whose unmap fails stays mapped (and cached),
// so the books still match the driver.
void PageSupply::map_and_grant(Reservation& r, const Filled& filled, Grants grant) {
  size_t mapped = 0;
  try {
    for (; mapped < filled.size(); ++mapped) {
      map_handle(r, filled[mapped].first, filled[mapped].second);
    }
    for (const auto& [s, h] : filled) grant.emplace_back(s.page, s.pages());
    std::sort(grant.begin(), grant.end());
    for (size_t i = 0; i < grant.size();) {
      size_t j = i + 1;
      size_t end = grant[i].first + grant[i].second;
      while (j < grant.size() && grant[j].first == end) end += grant[j++].second;
      drv_.set_access(r.page_addr(grant[i].first), (end - grant[i].first) * page_, j - i);
      r.note_granted(grant[i].first, end);
      i = j;
    }
  } catch (...) {
    for (size_t i = 0; i < mapped; ++i) {
      const HandleSlot& s = filled[i].first;
      try {
        unmap_handles(r, s.page, s.page + s.pages());
      } catch (...) {
      }
    }
    put_back(filled, mapped);
    note_peaks(0);
    throw;
  }
  note_peaks(0);
}

// ---- reclaiming and giving back ---------------------------------------------------------------

// Unmaps about `want` pages (whole handles) lying wholly inside safe free blocks into the pool.
// cuMemUnmap is priced per mapping (about 41 us each on an H100), so the largest handles go
// first: `want` is made of as few handles as the free memory allows (greedy by size, none larger
// than what is still wanted, then the smallest that covers the rest). Adjacent handles go in one
// cuMemUnmap.
size_t PageSupply::reclaim(size_t want) {
  if (want == 0) return 0;
  std::vector<ReclaimableHandle> all = placement_.reclaimable_handles();
  std::stable_sort(all.begin(), all.end(), [](const ReclaimableHandle& x,
                                              const ReclaimableHandle& y) {
    return x.pages > y.pages;
  });
  std::vector<ReclaimableHandle> take;
  std::vector<uint8_t> taken(all.size(), 0);
  size_t got = 0;
  for (size_t i = 0; i < all.size() && got < want; ++i) {
    if (all[i].pages <= want - got) {
      take.push_back(all[i]);
      taken[i] = 1;
      got += all[i].pages;
    }
  }
  for (size_t i = all.size(); i-- > 0 && got < want;) {  // smallest first: the rest
    if (taken[i] != 0) continue;
    take.push_back(all[i]);
    got += all[i].pages;
  }
  unmap_into_pool(std::move(take));
  stats_.num_reclaimed_pages += got;
  return got;
}

void PageSupply::unmap_into_pool(std::vector<ReclaimableHandle> take) {
  std::sort(take.begin(), take.end(), [](const ReclaimableHandle& x, const ReclaimableHandle& y) {
    return x.res != y.res ? x.res < y.res : x.head < y.head;
  });
  for (size_t i = 0; i < take.size();) {  // one cuMemUnmap per run of adjacent handles
    size_t j = i + 1;
    size_t end = take[i].head + take[i].pages;
    while (j < take.size() && take[j].res == take[i].res && take[j].head == end) {
      end += take[j].pages;
      ++j;
    }
    unmap_handles(placement_.res(take[i].res), take[i].head, end);
    i = j;
  }
}

size_t PageSupply::give_back(std::vector<ReclaimableHandle> handles) {
  unmap_into_pool(handles);
  size_t pages = 0;
  for (const ReclaimableHandle& h : handles) {
    if (held_pages() < reserved_pages_ + h.pages) continue;  // the reservation keeps it pooled
    release_pooled(h.pages);
    pages += h.pages;
  }
  return pages;
}

void PageSupply::trim_to(size_t max_held, size_t floor) {
  give_back_retired();
  if (floor == SIZE_MAX) floor = reserved_pages_;
  max_held = std::max(max_held, floor);
  // Over a floor, a pooled handle larger than what is over would take the memory held below it
  // (reserved handles are large): what is over is released in handles no larger than it where
  // the pool has them; a larger one goes only once its pages beyond what is over exist again as
  // power-of-two pieces (created first: the held pages never dip below the floor).
  auto release_over = [&]() -> size_t {
    if (floor == 0) return release_largest_pooled();
    const size_t over = held_pages() - max_held;
    size_t n = pool_.has(over) ? over : pool_.largest_below(over);
    if (n == 0) {
      n = pool_.smallest_above(over);
      if (n == 0 || !make_pieces(n - over)) return 0;
    }
    release_pooled(n);
    return n;
  };
  while (held_pages() > max_held && release_over() != 0) {
  }
  if (held_pages() > max_held) {
    const size_t reclaimed = reclaim(held_pages() - max_held);
    stats_.num_reclaimed_pages -= reclaimed;  // released, not reused elsewhere
    while (held_pages() > max_held && release_over() != 0) {
    }
  }
  if (held_pages() < floor) top_up(floor);
}

bool PageSupply::make_pieces(size_t pages) {
  if (room() < pages) return false;
  std::vector<size_t> made;  // pooled here, in order
  size_t rest = pages;
  try {
    made.reserve(64);  // one per bit of `pages`
    while (rest != 0) {
      size_t n = 1;
      while (n * 2 <= rest) n *= 2;
      CUmemGenericAllocationHandle h = 0;
      if (drv_.create(n * page_, &h) != CUDA_SUCCESS) break;
      stats_.num_created_pages += n;
      try {
        pool_.put(n, h);
      } catch (...) {
        drv_.release(h, n * page_);
        stats_.num_released_pages += n;
        throw;
      }
      made.push_back(n);
      rest -= n;
    }
  } catch (...) {
  }
  if (rest == 0) {
    note_peaks(0);
    return true;
  }
  // Not all of them: what was made goes back (it was beyond what is held).
  for (size_t n : made) {
    try {
      release_pooled(n);
    } catch (...) {
    }
  }
  return false;
}

size_t PageSupply::shed_pooled(size_t pages) {
  size_t shed = 0;
  while (shed < pages && held_pages() > reserved_pages_) {
    const size_t over = std::min(held_pages() - reserved_pages_, pages - shed);
    const size_t n = pool_.has(over) ? over : pool_.largest_below(over);
    if (n == 0) break;
    release_pooled(n);
    shed += n;
  }
  return shed;
}

std::vector<size_t> PageSupply::whole_handles_for(size_t pages) {
  // Candidates: every pooled handle and every handle under safe free memory (the shapes freed
  // blocks had), so that the spare is the least the held shapes allow.
  struct Candidate {
    size_t pages;
    bool pooled;
    ReclaimableHandle where;
  };
  std::vector<Candidate> all;
  pool_.for_each([&](size_t n, CUmemGenericAllocationHandle) { all.push_back({n, true, {}}); });
  for (const ReclaimableHandle& h : placement_.reclaimable_handles()) all.push_back({h.pages, false, h});
  std::stable_sort(all.begin(), all.end(), [](const Candidate& x, const Candidate& y) {
    return x.pages != y.pages ? x.pages > y.pages : x.pooled && !y.pooled;  // pooled first
  });
  std::vector<size_t> chosen;  // indices into all
  std::vector<uint8_t> used(all.size(), 0);
  size_t rest = pages;
  for (size_t i = 0; i < all.size() && rest != 0; ++i) {
    if (all[i].pages <= rest) {
      chosen.push_back(i);
      used[i] = 1;
      rest -= all[i].pages;
    }
  }
  for (size_t i = all.size(); rest != 0 && i-- > 0;) {  // the smallest that covers the rest
    if (used[i] == 0 && all[i].pages >= rest) {
      chosen.push_back(i);
      rest = 0;
    }
  }
  if (rest != 0) return {};  // fewer pages than asked
  std::vector<ReclaimableHandle> unmap;
  std::vector<size_t> out;
  for (size_t i : chosen) {
    out.push_back(all[i].pages);
    if (!all[i].pooled) unmap.push_back(all[i].where);
  }
  if (!unmap.empty()) {
    size_t got = 0;
    for (const ReclaimableHandle& h : unmap) got += h.pages;
    unmap_into_pool(std::move(unmap));
    stats_.num_reclaimed_pages += got;
  }
  std::sort(out.begin(), out.end(), std::greater<size_t>());
  return out;
}

void PageSupply::map_whole(Reservation& r, size_t first, const std::vector<size_t>& sizes) {
  Filled filled;
  filled.reserve(sizes.size());
  size_t p = first;
  for (size_t n : sizes) {
    filled.emplace_back(HandleSlot{p, n}, pool_.take(n));  // reserved: does not throw
    p += n;
  }
  map_and_grant(r, filled, {});  // on a failure its handles go back to the pool
}

}  // namespace expanse::core
