// The reservation: physical pages taken up front and kept (docs/design.md, "Reservations").
//
// Reserved pages are created into the pool of unmapped handles, so they serve blocks the way
// reclaimed pages do. A handle is mapped whole, and cuMemSetAccess and cuMemUnmap are priced per
// mapping, so one-page reserved handles cost every large block a mapping per page (a 32 GiB block:
// 16,384). The reservation is therefore made of large handles (max_handle_size by default, a few
// cuMemCreate to make), and a slot is given a handle of its own size made of pooled pages
// released for it (Gathering::from_reserve): a larger one cut once, the rest kept pooled as
// power-of-two pieces, or smaller ones merged. That is a cuMemCreate on the allocation path and a
// moment in which another process may take the memory (top_up creates again what it took);
// reserve_handle_size of one page keeps one-page handles that are never reshaped: no cuMemCreate
// for a workload that fits, a mapping per page.
#include "core/base/check.hpp"
#include "core/pages/page_supply.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace expanse::core {
namespace {

// Releases handles created for a reservation that will not be kept; one the driver refuses to
// release is kept pooled (books match the driver). Returns the pages kept.
template <class Release, class Keep>
size_t undo_created(const std::vector<std::pair<size_t, CUmemGenericAllocationHandle>>& created,
                    Release&& release, Keep&& keep) {
  size_t kept = 0;
  for (const auto& [n, h] : created) {
    try {
      release(n, h);
    } catch (...) {
      keep(n, h);
      kept += n;
    }
  }
  return kept;
}

}  // namespace

PageSupply::ReserveOutcome PageSupply::reserve(size_t pages, size_t handle_pages, bool partial) {
  ReserveOutcome out;
  out.asked = pages;
  out.held_before = held_pages();
  if (handle_pages == 0) handle_pages = 1;
  reserve_handle_pages_ = handle_pages;

  if (pages <= held_pages()) {
    // Shrinking (or growing over memory already held): what the reservation stops covering and
    // no live block uses goes back to the driver; cached memory beyond it stays cached.
    const size_t unused_before = reserved_unused_pages();
    reserved_pages_ = pages;
    reserve_asked_pages_ = pages;
    const size_t unused_after = reserved_unused_pages();
    if (unused_before > unused_after) trim_to(held_pages() - (unused_before - unused_after));
    out.got = pages;
    return out;
  }

  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> created;
  size_t need = pages - held_pages();
  size_t in_hand = 0;
  auto release = [&](size_t n, CUmemGenericAllocationHandle h) {
    drv_.release(h, n * page_);
    stats_.num_released_pages += n;
  };
  auto keep = [&](size_t n, CUmemGenericAllocationHandle h) { pool_.put(n, h); };
  try {
    size_t size = std::min(handle_pages, need);
    while (need > 0) {
      size = std::min(size, need);
      CUmemGenericAllocationHandle h = 0;
      if (drv_.create(size * page_, &h) != CUDA_SUCCESS) {  // out of memory
        if (size == 1) break;
        size /= 2;  // the device may still hold smaller pieces
        continue;
      }
      created.emplace_back(size, h);
      stats_.num_created_pages += size;
      in_hand += size;
      need -= size;
      note_peaks(in_hand);
    }
  } catch (...) {
    undo_created(created, release, keep);
    throw;
  }
  out.whole = need == 0;
  if (!out.whole && !partial) {
    undo_created(created, release, keep);
    out.got = reserved_pages_;
    return out;
  }
  for (const auto& [n, h] : created) pool_.put(n, h);
  reserved_pages_ = held_pages();
  reserve_asked_pages_ = pages;
  out.got = reserved_pages_;
  return out;
}

// The lacking pages come back as handles of decreasing powers of two (at most the reservation's
// handle size): pieces that the next smaller slots take whole or cut, instead of another large
// handle to release again.
void PageSupply::top_up(size_t to) noexcept {
  if (to == SIZE_MAX) to = reserved_pages_;
  to = std::min(to, std::min(capacity_pages_, limit_pages_));  // never beyond the limit
  size_t size = reserve_handle_pages_;
  while (held_pages() < to) {
    const size_t lack = to - held_pages();
    size_t pow2 = 1;
    while (pow2 * 2 <= lack) pow2 *= 2;
    size = std::min(size, pow2);
    CUmemGenericAllocationHandle h = 0;
    try {
      if (drv_.create(size * page_, &h) != CUDA_SUCCESS) {
        if (size == 1) return;  // taken meanwhile: held stays below the reservation
        size /= 2;
        continue;
      }
    } catch (...) {
      return;
    }
    try {
      pool_.put(size, h);
    } catch (...) {  // out of host memory: the pages stay with the driver
      try {
        drv_.release(h, size * page_);
      } catch (...) {
      }
      return;
    }
    stats_.num_created_pages += size;
    note_peaks(0);
  }
  give_back_retired(to);
}

void PageSupply::retire(size_t pages, CUmemGenericAllocationHandle h) noexcept {
  try {
    retired_.emplace_back(pages, h);
    retired_pages_ += pages;
  } catch (...) {  // out of host memory: released now, the reservation's promise aside
    try {
      drv_.release(h, pages * page_);
      stats_.num_released_pages += pages;
    } catch (...) {
    }
  }
}

void PageSupply::give_back_retired(size_t floor) noexcept {
  for (size_t i = 0; i < retired_.size();) {
    const auto [n, h] = retired_[i];
    try {
      if (!may_release(n) || held_pages() < floor + n) {
        // Its replacement first, in the room beside what is held: never a dip.
        if (room() < n) return;
        CUmemGenericAllocationHandle fresh = 0;
        if (drv_.create(n * page_, &fresh) != CUDA_SUCCESS) {
          note_refused();
          return;
        }
        try {
          pool_.put(n, fresh);
        } catch (...) {
          drv_.release(fresh, n * page_);
          return;
        }
        note_created();
        stats_.num_created_pages += n;
        note_peaks(0);
      }
      drv_.release(h, n * page_);
    } catch (...) {
      ++i;  // the driver keeps it for now: offered again later
      continue;
    }
    stats_.num_released_pages += n;
    retired_pages_ -= n;
    retired_[i] = retired_.back();
    retired_.pop_back();
  }
}

}  // namespace expanse::core
