// Where physical pages come from and where they go: the pool, new handles, pages reclaimed from
// under free memory (compaction in VA space), and giving memory back to the driver.
#include "core/allocator_internal.hpp"
#include "driver/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace expanse::core {

CUmemGenericAllocationHandle DeviceAllocator::take_pool() {
  CUmemGenericAllocationHandle h = pool_.back();
  pool_.pop_back();
  return h;
}

void DeviceAllocator::ensure_pages(Reservation& r, size_t first, size_t last, PageRequest& req) {
  std::vector<size_t> need;     // pages to map
  std::vector<size_t> regrant;  // mapped pages still without access (a failed undo left them)
  for (size_t p = first; p <= last; ++p) {
    if (!r.mapped(p)) {
      need.push_back(p);
    } else if (!r.ready(p)) {
      regrant.push_back(p);
    }
  }
  if (need.empty() && regrant.empty()) return;
  const size_t k = need.size();
  req.needed = k;

  // Gather k physical pages: the pool first; then new pages and pages reclaimed from under free
  // memory anywhere, in the order the policy asks (AllocatorOptions::reclaim_before_create).
  std::vector<CUmemGenericAllocationHandle> hs;
  hs.reserve(k);
  try {
    while (hs.size() < k && !pool_.empty()) {
      hs.push_back(take_pool());
      ++req.from_pool;
    }
    auto create_more = [&] {
      while (hs.size() < k && !req.create_oom) {
        if (mapped_pages_ + pool_.size() + hs.size() >= limit_pages_) {
          req.limit_hit = true;
          return;
        }
        CUmemGenericAllocationHandle h = 0;
        if (drv_.create(page_, &h) == CUDA_ERROR_OUT_OF_MEMORY) {
          req.create_oom = true;
          return;
        }
        hs.push_back(h);
        ++req.created;
        ++stats_.num_created_pages;
        note_peaks(hs.size());
      }
    };
    auto reclaim_more = [&] {
      if (hs.size() >= k) return;
      if (has_unfinished_frees()) poll(false);
      req.reclaimed += reclaim(k - hs.size(), hs);
    };
    if (opts_.reclaim_before_create) {
      reclaim_more();
      create_more();
    } else {
      create_more();
      reclaim_more();
    }
    if (hs.size() < k) {
      // Last resort: wait for every stream's work on freed memory, then reclaim under it.
      flush_lifos();
      poll(true);
      req.waited = true;
      req.reclaimed += reclaim(k - hs.size(), hs);
    }
    if (hs.size() < k) {
      pool_.insert(pool_.end(), hs.begin(), hs.end());
      throw_oom(req);
    }
  } catch (const out_of_memory&) {
    throw;
  } catch (...) {
    pool_.insert(pool_.end(), hs.begin(), hs.end());
    throw;
  }

  // Map one handle per page, then grant access run by run (one cuMemSetAccess per run).
  size_t mapped = 0;
  try {
    for (; mapped < k; ++mapped) {
      drv_.map(r.page_addr(need[mapped]), page_, hs[mapped]);
      if (events_ != nullptr) events_->on_map(device(), r.page_addr(need[mapped]), page_);
      r.handles[need[mapped]] = hs[mapped];
      r.granted[need[mapped]] = 0;
      ++r.mapped_pages;
      ++mapped_pages_;
    }
    std::vector<size_t> grant = need;
    grant.insert(grant.end(), regrant.begin(), regrant.end());
    std::sort(grant.begin(), grant.end());
    for (size_t i = 0; i < grant.size();) {
      size_t j = i + 1;
      while (j < grant.size() && grant[j] == grant[j - 1] + 1) ++j;
      drv_.set_access(r.page_addr(grant[i]), (j - i) * page_);
      for (size_t q = i; q < j; ++q) r.granted[grant[q]] = 1;
      i = j;
    }
  } catch (...) {
    // Undo this call's mappings; a page whose unmap fails stays mapped (and cached), so the
    // books still match the driver.
    for (size_t i = 0; i < mapped; ++i) {
      try {
        drv_.unmap(r.page_addr(need[i]), page_);
      } catch (...) {
        continue;
      }
      if (events_ != nullptr) events_->on_unmap(device(), r.page_addr(need[i]), page_);
      r.handles[need[i]] = 0;
      --r.mapped_pages;
      --mapped_pages_;
      pool_.push_back(hs[i]);
    }
    pool_.insert(pool_.end(), hs.begin() + static_cast<std::ptrdiff_t>(mapped), hs.end());
    note_peaks(0);
    throw;
  }
  note_peaks(0);
}

void DeviceAllocator::note_peaks(size_t in_hand) {
  stats_.peak_mapped_bytes = std::max<uint64_t>(stats_.peak_mapped_bytes, mapped_pages_ * page_);
  stats_.peak_physical_bytes =
      std::max<uint64_t>(stats_.peak_physical_bytes, (held_pages() + in_hand) * page_);
}

// Unmaps up to `want` mapped pages lying wholly under safe free blocks (large arena first, largest
// blocks first) and appends their handles to `out`. Contiguous pages go in one cuMemUnmap.
size_t DeviceAllocator::reclaim(size_t want, std::vector<CUmemGenericAllocationHandle>& out) {
  size_t got = 0;
  for (Arena a : {Arena::large, Arena::small}) {
    if (got >= want) break;
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      Reservation& r = res(it->second.res);
      size_t lo = 0, hi = 0;
      r.inner_pages(it->first, it->second.size, &lo, &hi);
      for (size_t p = lo; p < hi && got < want;) {
        if (!r.mapped(p)) {
          ++p;
          continue;
        }
        size_t q = p;
        while (q < hi && r.mapped(q) && (q - p) < want - got) ++q;
        drv_.unmap(r.page_addr(p), (q - p) * page_);
        if (events_ != nullptr) events_->on_unmap(device(), r.page_addr(p), (q - p) * page_);
        for (size_t i = p; i < q; ++i) {
          out.push_back(r.handles[i]);
          r.handles[i] = 0;
          r.granted[i] = 0;
        }
        r.mapped_pages -= q - p;
        mapped_pages_ -= q - p;
        got += q - p;
        p = q;
      }
      return got < want;
    });
  }
  stats_.num_reclaimed_pages += got;
  return got;
}

// ---- giving memory back ---------------------------------------------------------------------

// Releases pooled pages, then reclaims and releases cached pages, until at most max_held pages are
// held. Only safe free memory is touched.
void DeviceAllocator::trim_to(size_t max_held, bool release_reservations) {
  while (held_pages() > max_held && !pool_.empty()) {
    drv_.release(pool_.back());
    pool_.pop_back();
    ++stats_.num_released_pages;
  }
  if (held_pages() > max_held) {
    std::vector<CUmemGenericAllocationHandle> hs;
    try {
      reclaim(held_pages() - max_held, hs);
    } catch (...) {
      pool_.insert(pool_.end(), hs.begin(), hs.end());
      throw;
    }
    stats_.num_reclaimed_pages -= hs.size();  // released, not reused elsewhere
    while (!hs.empty()) {
      try {
        drv_.release(hs.back());
      } catch (...) {
        pool_.insert(pool_.end(), hs.begin(), hs.end());
        throw;
      }
      hs.pop_back();
      ++stats_.num_released_pages;
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
    flush_lifos();
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
      flush_lifos();
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
