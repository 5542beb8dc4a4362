// Where physical pages come from and where they go: the pool, new handles, pages reclaimed from
// under free memory (compaction in VA space), and giving memory back to the driver.
#include "core/allocator_internal.hpp"
#include "driver_api/cost_model.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace expanse::core {

void DeviceAllocator::pool_put(size_t pages, CUmemGenericAllocationHandle h) {
  pool_[pages].push_back(h);
  pool_pages_ += pages;
}

CUmemGenericAllocationHandle DeviceAllocator::pool_take(size_t pages) {
  auto it = pool_.find(pages);
  assert(it != pool_.end() && !it->second.empty());
  CUmemGenericAllocationHandle h = it->second.back();
  it->second.pop_back();
  if (it->second.empty()) pool_.erase(it);
  pool_pages_ -= pages;
  return h;
}

void DeviceAllocator::release_pooled(size_t pages) {
  // Out of the pool only once the driver took it: a failed release leaves the books as they were.
  drv_.release(pool_.at(pages).back(), pages * page_);
  pool_take(pages);
  stats_.num_released_pages += pages;
}

size_t DeviceAllocator::release_largest_pooled() {
  if (pool_.empty()) return 0;
  const size_t n = pool_.rbegin()->first;
  release_pooled(n);
  return n;
}

// Whether releasing a pooled handle of n pages and creating its pages as part of a larger
// handle costs less by the cost model than mapping it as a handle of its own (its cuMemMap and
// its mapping's share of cuMemSetAccess). Per-byte parts paid either way cancel.
bool DeviceAllocator::exchange_pays(size_t n) const {
  const driver::CostModel& m = driver::CostModel::get_default();
  using driver::EntryPoint;
  const size_t b = page_ * n;
  auto per_byte = [&](EntryPoint e) { return m.cost_ns(e, b) - m.cost_ns(e, 0); };
  const double remap = m.cost_ns(EntryPoint::mem_map, b) + m.cost_ns(EntryPoint::mem_set_access, b);
  const double swap = m.cost_ns(EntryPoint::mem_release, b) + per_byte(EntryPoint::mem_create) +
                      per_byte(EntryPoint::mem_map) + per_byte(EntryPoint::mem_set_access);
  return swap < remap;
}

void DeviceAllocator::map_handle(Reservation& r, const HandleSlot& s,
                                 CUmemGenericAllocationHandle h) {
  drv_.map(r.page_addr(s.page), s.pages() * page_, h);
  if (events_ != nullptr) events_->on_map(device(), r.page_addr(s.page), s.pages() * page_);
  for (size_t p = s.page; p < s.page + s.pages(); ++p) {
    r.handles[p] = h;
    r.head[p] = static_cast<uint32_t>(s.page);
    r.span[p] = static_cast<uint32_t>(s.count);
    r.granted[p] = 0;
  }
  r.mapped_pages += s.pages();
  mapped_pages_ += s.pages();
}

void DeviceAllocator::unmap_handles(Reservation& r, size_t p, size_t q) {
  size_t n = 0;
  for (size_t i = p; i < q; i += r.handle_pages(i)) ++n;
  drv_.unmap(r.page_addr(p), (q - p) * page_, n);
  if (events_ != nullptr) events_->on_unmap(device(), r.page_addr(p), (q - p) * page_);
  for (size_t i = p; i < q;) {
    const size_t k = r.span[i];
    pool_put(k, r.handles[i]);
    for (size_t j = i; j < i + k; ++j) {
      r.handles[j] = 0;
      r.head[j] = 0;
      r.span[j] = 0;
      r.granted[j] = 0;
    }
    i += k;
  }
  r.mapped_pages -= q - p;
  mapped_pages_ -= q - p;
}

void DeviceAllocator::ensure_pages(Reservation& r, CUdeviceptr addr, size_t bytes,
                                   PageRequest& req) {
  const size_t first = r.first_page(addr), last = r.last_page(addr, bytes);
  size_t lo = 0, hi = 0;
  r.inner_pages(addr, bytes, &lo, &hi);
  // What the block lacks: unmapped runs get handles planned for it; mapped handles without access
  // get it. A multi-page handle reaching outside the block's inner pages (free and safe:
  // find_block checked) is split: unmapped, released, and replaced by handles that each lie
  // inside it, so handles only ever get finer where blocks' boundaries fall and a repeated
  // workload settles into finding everything mapped. Its pages outside the block are covered
  // again only if memory is at hand (`extra`); those after the block are cut where more blocks of
  // its size would fall (plan_handles_periodic), so a freed block refilled by smaller ones of one
  // size is split once, not once per block (on cs336b_ctx128_fullstep: 481 splits -> 284).
  std::vector<HandleSlot> slots, extra;
  std::vector<std::pair<size_t, size_t>> grant;  // (first page, pages) of mapped handles to grant
  std::vector<size_t> split;                     // heads of handles to split
  for (size_t p = first; p <= last;) {
    if (!r.mapped(p)) {
      size_t q = p;
      while (q <= last && !r.mapped(q)) ++q;
      plan_handles(p, q, lo, hi, max_pages_, slots);
      p = q;
      continue;
    }
    const size_t head = r.handle_head(p), n = r.handle_pages(p);
    if (n > 1 && (head < lo || head + n > hi)) {
      split.push_back(head);
    } else if (!r.ready(p)) {
      grant.emplace_back(head, n);
    }
    p = head + n;
  }
  for (size_t head : split) {
    const size_t n = r.span[head];
    unmap_handles(r, head, head + n);
    release_pooled(n);
    const size_t a = std::max(head, first), z = std::min(head + n, last + 1);
    if (head < a) plan_handles(head, a, head, a, max_pages_, extra);
    plan_handles(a, z, std::max(lo, a), std::min(hi, z), max_pages_, slots);
    if (z < head + n)
      plan_handles_periodic(z, head + n, first, addr - r.page_addr(first), bytes, page_,
                            max_pages_, extra);
  }
  if (slots.empty() && grant.empty() && extra.empty()) return;
  for (const HandleSlot& s : slots) req.needed += s.pages();

  std::vector<std::pair<HandleSlot, CUmemGenericAllocationHandle>> filled;
  std::vector<HandleSlot> open = slots;
  try {
    gather_handles(open, filled, req);
  } catch (...) {
    for (const auto& [s, h] : filled) pool_put(s.count, h);
    throw;
  }
  if (!open.empty()) {
    for (const auto& [s, h] : filled) pool_put(s.count, h);
    throw_oom(req);
  }
  try {
    size_t in_hand = 0;
    for (const auto& f : filled) in_hand += f.first.pages();
    for (const HandleSlot& s : extra) {
      CUmemGenericAllocationHandle h = 0;
      if (pool_has(s.count)) {
        h = pool_take(s.count);
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
  } catch (...) {
    for (const auto& [s, h] : filled) pool_put(s.count, h);
    throw;
  }

  // Map each handle, then grant access run by run (one cuMemSetAccess per contiguous run).
  size_t mapped = 0;
  try {
    for (; mapped < filled.size(); ++mapped) map_handle(r, filled[mapped].first, filled[mapped].second);
    for (const auto& [s, h] : filled) grant.emplace_back(s.page, s.pages());
    std::sort(grant.begin(), grant.end());
    for (size_t i = 0; i < grant.size();) {
      size_t j = i + 1;
      size_t end = grant[i].first + grant[i].second;
      while (j < grant.size() && grant[j].first == end) end += grant[j++].second;
      drv_.set_access(r.page_addr(grant[i].first), (end - grant[i].first) * page_, j - i);
      for (size_t p = grant[i].first; p < end; ++p) r.granted[p] = 1;
      i = j;
    }
  } catch (...) {
    // Undo this call's mappings; a handle whose unmap fails stays mapped (and cached), so the
    // books still match the driver.
    for (size_t i = 0; i < mapped; ++i) {
      const HandleSlot& s = filled[i].first;
      try {
        unmap_handles(r, s.page, s.page + s.pages());
      } catch (...) {
      }
    }
    for (size_t i = mapped; i < filled.size(); ++i) pool_put(filled[i].first.count, filled[i].second);
    note_peaks(0);
    throw;
  }
  note_peaks(0);
}

// Where a request's handles come from: pooled handles of the slot's size; new handles while the
// device and the limit allow; handles reclaimed from under free memory (in the order
// AllocatorOptions::reclaim_before_create says). Under pressure slots are split to use smaller
// pooled handles, and pooled handles too large for any slot are released so smaller ones can be
// created: a request fails only when the pages do not exist (invariant 1).
void DeviceAllocator::gather_handles(
    std::vector<HandleSlot>& open,
    std::vector<std::pair<HandleSlot, CUmemGenericAllocationHandle>>& filled, PageRequest& req) {
  size_t in_hand = 0;
  size_t credit = 0;  // pages released below to be created again: allowed even over the limit
  auto take = [&](const HandleSlot& s, CUmemGenericAllocationHandle h) {
    filled.emplace_back(s, h);
    in_hand += s.pages();
  };
  // Pooled handles of each open slot's size; with split, the largest smaller pooled handle fills
  // the slot's first pages and the rest stays open.
  auto from_pool = [&](bool split) {
    std::vector<HandleSlot> rest;
    while (!open.empty()) {
      HandleSlot s = open.back();
      open.pop_back();
      if (pool_has(s.count)) {
        req.from_pool += s.pages();
        take(s, pool_take(s.count));
        continue;
      }
      auto smaller = pool_.lower_bound(s.count);
      if (split && smaller != pool_.begin()) {
        const size_t n = std::prev(smaller)->first;
        req.from_pool += n;
        take({s.page, n}, pool_take(n));
        open.push_back({s.page + n, s.count - n});
      } else {
        rest.push_back(s);
      }
    }
    open.swap(rest);
  };
  // A slot cut in two halves (the driver or the limit refused it whole).
  auto halve = [&](const HandleSlot& s) {
    const size_t h = s.count / 2;
    open.push_back({s.page + h, s.count - h});
    open.push_back({s.page, h});
  };
  auto create_more = [&] {
    std::vector<HandleSlot> rest;
    while (!open.empty() && !req.create_oom) {
      HandleSlot s = open.back();
      open.pop_back();
      const bool exchange = s.pages() <= credit;
      if (!exchange && held_pages() + in_hand + s.pages() > limit_pages_) {
        req.limit_hit = true;
        if (s.count == 1) {
          rest.push_back(s);
          break;
        }
        halve(s);
        continue;
      }
      CUmemGenericAllocationHandle h = 0;
      if (drv_.create(s.pages() * page_, &h) == CUDA_ERROR_OUT_OF_MEMORY) {
        if (s.count == 1) {
          req.create_oom = true;
          rest.push_back(s);
          break;
        }
        halve(s);
        continue;
      }
      if (exchange) credit -= s.pages();
      take(s, h);
      req.created += s.pages();
      stats_.num_created_pages += s.pages();
      note_peaks(in_hand);
    }
    rest.insert(rest.end(), open.begin(), open.end());
    open.swap(rest);
  };
  auto open_pages = [&] {
    size_t n = 0;
    for (const HandleSlot& s : open) n += s.pages();
    return n;
  };
  auto reclaim_more = [&] {
    if (open.empty()) return;
    if (has_unfinished_frees()) poll(false);
    req.reclaimed += reclaim(open_pages());
    from_pool(false);
    // Remapping a small reclaimed handle into a larger slot costs a cuMemMap and a mapping's
    // share of cuMemSetAccess; releasing it and creating its pages as part of the slot's handle
    // can cost less by the cost model (2 MiB: ~24 us against ~62 us): exchange those.
    size_t largest_open = 0;
    for (const HandleSlot& s : open) largest_open = std::max(largest_open, s.count);
    while (!pool_.empty() && pool_.begin()->first < largest_open &&
           exchange_pays(pool_.begin()->first)) {
      const size_t n = pool_.begin()->first;
      release_pooled(n);
      credit += n;
    }
    // The rest fill the slots, cut to their sizes. A reclaimed handle larger than every open slot
    // (reclaim() takes the smallest that covers what is left) is released and the slots' pages
    // created in its place: kept in the pool, it would hold memory beside the new pages.
    from_pool(true);
    while (!open.empty() && !pool_.empty() && pool_.rbegin()->first > largest_open) {
      const size_t n = pool_.rbegin()->first;
      release_pooled(n);
      credit += n;
    }
    req.create_oom = false;
    create_more();
    from_pool(true);
  };
  // Pooled handles no open slot can take are released, and new ones created in their place.
  auto release_and_create = [&] {
    while (!open.empty()) {
      size_t largest_open = 0;
      for (const HandleSlot& s : open) largest_open = std::max(largest_open, s.count);
      if (pool_.empty() || pool_.rbegin()->first <= largest_open) return;
      const size_t n = pool_.rbegin()->first;
      release_pooled(n);
      credit += n;
      req.create_oom = false;
      create_more();
      from_pool(true);
    }
  };

  from_pool(false);
  // High water: physical memory grows past the most pages live blocks have touched (with this
  // request) plus a little slack only when nothing can be reclaimed, so while memory is plentiful
  // the footprint still follows the live set; a repeat of the workload stays under the mark.
  const size_t slack = opts_.high_water_slack == kNoLimit
                           ? SIZE_MAX
                           : touched_pages_ / 256 + opts_.high_water_slack / page_;
  high_water_ = std::max(high_water_, touched_pages_ + open_pages());
  const bool over = slack != SIZE_MAX && held_pages() + open_pages() > high_water_ + slack;
  if (opts_.reclaim_before_create || over) {
    reclaim_more();
    create_more();
  } else {
    create_more();
    reclaim_more();
  }
  from_pool(true);
  release_and_create();
  if (!open.empty()) {
    // Last resort: wait for every stream's work on freed memory, then reclaim under it.
    poll(true);
    req.waited = true;
    reclaim_more();
    req.create_oom = false;
    create_more();
    release_and_create();
  }
}

void DeviceAllocator::note_peaks(size_t in_hand) {
  stats_.peak_mapped_bytes = std::max<uint64_t>(stats_.peak_mapped_bytes, mapped_pages_ * page_);
  stats_.peak_physical_bytes =
      std::max<uint64_t>(stats_.peak_physical_bytes, (held_pages() + in_hand) * page_);
}

// Unmaps about `want` pages (whole handles) lying wholly inside safe free blocks into the pool.
// cuMemUnmap is priced per mapping (reference/driver_costs.md: ~41 us each), so the largest
// handles go first: `want` is made of as few handles as the free memory allows (greedy by size,
// none larger than what is still wanted, then the smallest that covers the rest). Adjacent
// handles go in one cuMemUnmap.
size_t DeviceAllocator::reclaim(size_t want) {
  if (want == 0) return 0;
  struct Candidate {
    size_t pages;
    uint32_t res;
    size_t head;
  };
  std::vector<Candidate> all;
  for (Arena a : {Arena::large, Arena::small}) {
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      const Reservation& r = res(it->second.res);
      size_t lo = 0, hi = 0;
      r.inner_pages(it->first, it->second.size, &lo, &hi);
      for (size_t p = lo; p < hi;) {
        if (!r.mapped(p)) {
          ++p;
          continue;
        }
        const size_t head = r.handle_head(p), n = r.handle_pages(p);
        if (head >= lo && head + n <= hi) all.push_back({n, r.id, head});
        p = head + n;
      }
      return true;
    });
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& x, const Candidate& y) { return x.pages > y.pages; });
  std::vector<Candidate> take;
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
  std::sort(take.begin(), take.end(), [](const Candidate& x, const Candidate& y) {
    return x.res != y.res ? x.res < y.res : x.head < y.head;
  });
  for (size_t i = 0; i < take.size();) {
    size_t j = i + 1;
    size_t end = take[i].head + take[i].pages;
    while (j < take.size() && take[j].res == take[i].res && take[j].head == end) {
      end += take[j].pages;
      ++j;
    }
    unmap_handles(res(take[i].res), take[i].head, end);
    i = j;
  }
  stats_.num_reclaimed_pages += got;
  return got;
}

// ---- giving memory back ---------------------------------------------------------------------

// Releases pooled handles, then reclaims and releases cached ones, until at most max_held pages are
// held (or nothing more can go). Only safe free memory is touched.
void DeviceAllocator::trim_to(size_t max_held, bool release_reservations) {
  while (held_pages() > max_held && release_largest_pooled() != 0) {
  }
  if (held_pages() > max_held) {
    const size_t reclaimed = reclaim(held_pages() - max_held);
    stats_.num_reclaimed_pages -= reclaimed;  // released, not reused elsewhere
    while (held_pages() > max_held && release_largest_pooled() != 0) {
    }
  }
  if (release_reservations) release_empty_reservations();
}

void DeviceAllocator::release_empty_reservations() {
  for (auto& rp : reservations_) {
    if (!rp || !rp->alive || rp->live_blocks != 0 || rp->mapped_pages != 0) continue;
    auto it = index_.blocks().find(rp->base);
    if (it == index_.blocks().end() || it->second.size != rp->size ||
        it->second.state != BlockState::free || !it->second.safe) {
      continue;
    }
    drv_.address_free(rp->base, rp->size);
    index_.remove_reservation(*rp);
    va_reserved_ -= rp->size;
    rp->alive = false;
  }
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    poll(true);
    trim_to(touched_pages_, true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(std::string("expanse: release_cached on device ") +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_pages_ = bytes == kNoLimit ? SIZE_MAX : bytes / page_;
  if (held_pages() > limit_pages_) {
    try {
      poll(false);
      trim_to(std::max(limit_pages_, touched_pages_), false);
    } catch (const driver::driver_error& e) {
      throw driver_failure(std::string("expanse: set_limit on device ") +
                               std::to_string(device()) + ": " + e.what(),
                           static_cast<int>(e.code()));
    }
  }
}

size_t DeviceAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_pages_ == SIZE_MAX ? kNoLimit : limit_pages_ * page_;
}

}  // namespace expanse::core
