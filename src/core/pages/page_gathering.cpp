// One request's search for handles to fill its slots (PageSupply::ensure_pages): the pool, new
// handles, reclaim, release-and-create, and last a wait for every stream's freed memory.
#include "core/base/check.hpp"
#include "core/pages/page_supply.hpp"

#include <algorithm>
#include <iterator>

namespace expanse::core {

class PageSupply::Gathering {
 public:
  Gathering(PageSupply& s, std::vector<HandleSlot>& open, Filled& filled, PageRequest& req)
      : s_(s), open_(open), filled_(filled), req_(req) {}

  // Fills open slots into `filled`; what is left open could not be had.
  void run();

 private:
  void take(const HandleSlot& slot, CUmemGenericAllocationHandle h) {
    filled_.emplace_back(slot, h);
    in_hand_ += slot.pages();
  }
  // A slot cut in two halves (the driver or the limit refused it whole).
  void halve(const HandleSlot& slot) {
    const size_t h = slot.count / 2;
    open_.push_back({slot.page + h, slot.count - h});
    open_.push_back({slot.page, h});
  }
  size_t open_pages() const {
    size_t n = 0;
    for (const HandleSlot& slot : open_) n += slot.pages();
    return n;
  }
  size_t largest_open() const {
    size_t n = 0;
    for (const HandleSlot& slot : open_) n = std::max(n, slot.count);
    return n;
  }
  // Releases the largest pooled handle to create its pages again (allowed even over the limit);
  // false, releasing nothing, when that would take the held pages below the reservation.
  bool exchange_largest() {
    const size_t n = s_.pool_.largest();
    if (!s_.may_release(n, in_hand_)) return false;
    s_.release_pooled(n);
    credit_ += n;
    return true;
  }
  void from_pool(bool split);
  bool from_reserve(const HandleSlot& slot);
  void create_more();
  // create: new handles for what reclaiming leaves open (false: reclaim only).
  void reclaim_more(bool create = true);
  void release_and_create();

  PageSupply& s_;
  std::vector<HandleSlot>& open_;
  Filled& filled_;
  PageRequest& req_;
  size_t in_hand_ = 0;
  size_t credit_ = 0;  // pages released here to be created again: allowed even over the limit
  bool covered_ = false;  // the reservation's untouched pages cover the request
  bool reclaimed_ = false;  // reclaim has run: pooled handles include ones freed blocks had
  size_t free_pages_ = SIZE_MAX;  // what the driver said it had free (SIZE_MAX: not asked)
  bool asked_free_ = false;
};

void PageSupply::gather(std::vector<HandleSlot>& open, Filled& filled, PageRequest& req) {
  ++asks_;
  Gathering(*this, open, filled, req).run();
}

void PageSupply::Gathering::run() {
  // Reserved pages are held to be used: the pooled ones serve the slots before anything else
  // (reshaped into the slots' handles, from_reserve; one-page reserved handles fill any slot).
  from_pool(s_.reserved_pages_ > 0);
  // High water: physical memory grows past the most pages live blocks have touched (with this
  // request) plus a little slack only when nothing can be reclaimed, so while memory is plentiful
  // the footprint still follows the live set; a repeat of the workload stays under the mark.
  const AllocatorOptions& opts = s_.opts_;
  const size_t slack = opts.high_water_slack == kNoLimit
                           ? SIZE_MAX
                           : s_.touched_pages_ / 256 + opts.high_water_slack / s_.page_;
  s_.high_water_ = std::max(s_.high_water_, s_.touched_pages_ + open_pages());
  const bool over = slack != SIZE_MAX && s_.held_pages() + open_pages() > s_.high_water_ + slack;
  // While the reservation covers the request, its pages under free memory serve it, after
  // waiting for the streams' work on them if need be: nothing beyond it is created, and the
  // memory left to other processes stays theirs.
  covered_ = s_.reserved_pages_ > 0 &&
             s_.touched_pages_ + s_.outside_pages_ + s_.retired_pages_ + in_hand_ + open_pages() <=
                 s_.reserved_pages_;
  if (covered_) {
    reclaim_more(false);
    if (!open_.empty()) {
      s_.streams_.poll(true);
      req_.waited = true;
      reclaim_more(false);
    }
  }
  if (opts.reclaim_before_create || over || covered_ || s_.guards_reserve()) {
    reclaim_more();
    create_more();
  } else {
    create_more();
    reclaim_more();
  }
  from_pool(true);
  release_and_create();
  if (!open_.empty()) {
    // Last resort: wait for every stream's work on freed memory, then reclaim under it.
    s_.streams_.poll(true);
    req_.waited = true;
    reclaim_more();
    req_.create_oom = false;
    create_more();
    release_and_create();
  }
}

// Pooled handles of each open slot's size; with split, the largest smaller pooled handle fills
// the slot's first pages and the rest stays open.
void PageSupply::Gathering::from_pool(bool split) {
  HandlePool& pool = s_.pool_;
  std::vector<HandleSlot> rest;
  while (!open_.empty()) {
    HandleSlot slot = open_.back();
    open_.pop_back();
    if (pool.has(slot.count)) {
      req_.from_pool += slot.pages();
      take(slot, pool.take(slot.count));
      continue;
    }
    if (split && s_.reshapes_reserve() && from_reserve(slot)) continue;
    const size_t n = pool.largest_below(slot.count);
    if (split && n != 0) {
      req_.from_pool += n;
      take({slot.page, n}, pool.take(n));
      open_.push_back({slot.page + n, slot.count - n});
    } else {
      rest.push_back(slot);
    }
  }
  open_.swap(rest);
}

// With a reservation, a slot gets what a new handle would give it without one: a handle of its
// own size. It is created within the reservation where the reservation lacks pages, and otherwise
// made of pooled pages: the smallest larger pooled handle (cut once) or smaller ones (merged),
// whichever the cost model prices lower. The slot's handle and power-of-two pieces of what the
// released handles hold beyond it are created first, in memory beyond the reservation (the
// margin others have left, the scratch), and the released handles go only once their pages exist
// again and the held pages stay at or above the reservation (PageSupply::may_release): a
// reservation never dips, so another process can never take what it holds (with
// reserve_may_dip, they go first and top_up creates what was taken). So blocks keep the handle
// shapes they have without a reservation (one-page reserved handles cost every large block a
// mapping per page), and a large reserved handle is cut once into pieces, not released for every
// smaller slot and created again after it (churn). Once reclaim has run, a pooled handle too
// large for releasing it to pay (exchange_pays) is mapped as it is, as a reclaimed handle is
// without a reservation. A merge that falls short makes the slot's first pages. True when the
// slot, or its first pages (the rest open again), was filled; false when the shape cannot be
// had (no scratch: the caller maps smaller pooled handles piece by piece, or takes larger ones
// whole, DeviceAllocator::place_whole_handles).
bool PageSupply::Gathering::from_reserve(const HandleSlot& slot) {
  HandlePool& pool = s_.pool_;
  const size_t k = slot.count;
  if (reclaimed_) {
    const size_t n = pool.largest_below(k);
    if (n != 0 && !s_.exchange_pays(n)) {
      req_.from_pool += n;
      take({slot.page, n}, pool.take(n));
      open_.push_back({slot.page + n, k - n});
      return true;
    }
  }
  std::vector<size_t> release;
  size_t pages = 0;
  const bool first = !s_.opts_.reserve_may_dip;  // created before what they replace is released
  if (first && req_.create_oom) return false;  // the driver refused this request's creates
  if (s_.held_pages() + in_hand_ + k > s_.reserved_pages_) {
    // Created first, a slot's handle is at most the room there is: a larger slot is made of
    // several (each merge's releases make room for the next), and a cut needs room for all of
    // the handle it cuts.
    const size_t room = first ? s_.room(in_hand_) : SIZE_MAX;
    const size_t want = std::min(k, room);
    if (want == 0) return false;  // no room: the pooled pages serve as they are
    release = pool.make_up(want);
    for (size_t n : release) pages += n;
    const size_t m = pool.smallest_above(want);
    if (m != 0 && m <= room &&
        (pages < want || s_.reshape_ns({m}, want) <= s_.reshape_ns(release, want))) {
      release.assign(1, m);
      pages = m;
    }
    // One smaller handle costs less mapped as it is than released and created again.
    if (release.empty() || (pages < want && release.size() == 1)) return false;
    if (!first) {
      for (size_t n : release) {
        s_.release_pooled(n);
        credit_ += n;  // created again below; what another process takes meanwhile, top_up retries
      }
    }
  } else {
    pages = k;  // the reservation lacks them: created in the slot's shape
  }
  const HandleSlot mine{slot.page, std::min({k, pages, first ? s_.room(in_hand_) : SIZE_MAX})};
  if (mine.count == 0) return false;
  CUmemGenericAllocationHandle h = 0;
  if (s_.drv_.create(mine.pages() * s_.page_, &h) != CUDA_SUCCESS) {
    // The room is the device's capacity less what this process holds: another process holds
    // it. The request's other slots would be refused too; they take the pooled pages as they are.
    if (first) s_.note_refused();
    req_.create_oom = true;
    return false;
  }
  if (first) s_.note_created();
  if (!first && !release.empty()) credit_ -= mine.pages();
  try {
    take(mine, h);
  } catch (...) {  // out of host memory: not kept in the books, so not kept at all
    s_.drv_.release(h, mine.pages() * s_.page_);
    throw;
  }
  req_.created += mine.pages();
  s_.stats_.num_created_pages += mine.pages();
  if (mine.count < k) open_.push_back({slot.page + mine.count, k - mine.count});
  for (size_t rest = release.empty() ? 0 : pages - mine.count; rest != 0;) {
    size_t n = 1;
    while (n * 2 <= rest) n *= 2;
    if (first && s_.room(in_hand_) < n) break;
    if (s_.drv_.create(n * s_.page_, &h) != CUDA_SUCCESS) break;
    try {
      pool.put(n, h);
    } catch (...) {
      s_.drv_.release(h, n * s_.page_);
      throw;
    }
    if (!first) credit_ -= n;
    rest -= n;
    s_.stats_.num_created_pages += n;
  }
  s_.note_peaks(in_hand_);
  // What they replace goes once the held pages stay whole without it; a piece the driver would
  // not create leaves its handle pooled (memory beyond the reservation, trimmed like any cached).
  if (first) {
    for (size_t n : release) {
      if (pool.has(n) && s_.may_release(n, in_hand_)) s_.release_pooled(n);
    }
  }
  return true;
}

// New handles while the device and the limit allow; a slot refused whole is halved.
void PageSupply::Gathering::create_more() {
  // Covered by the reservation while another process holds the rest of the device: the held
  // pages serve the request, and a cuMemCreate would be refused.
  if (covered_ && s_.guards_reserve() && s_.create_refused()) return;
  // Once the driver refuses a slot (or refused recently), what it has free is asked once a
  // request (cuMemGetInfo), and slots are cut to that rather than halved through a refusal each.
  auto ask_free = [&] {
    asked_free_ = true;
    try {
      free_pages_ = s_.drv_.free_memory() / s_.page_;
    } catch (const driver::driver_error&) {  // unknown: halving finds out
    }
  };
  if (s_.create_refused() && !open_.empty() && !asked_free_) ask_free();
  auto stop_refused = [&] {  // the last page refused: the request's creates end
    if (s_.guards_reserve() && s_.held_pages() + in_hand_ < s_.limit_pages_ &&
        s_.held_pages() + in_hand_ < s_.capacity_pages_) {
      s_.note_refused();  // not this process's limit nor the device's size: another's
    }
    req_.create_oom = true;
  };
  std::vector<HandleSlot> rest;
  while (!open_.empty() && !req_.create_oom) {
    HandleSlot slot = open_.back();
    open_.pop_back();
    const bool exchange = slot.pages() <= credit_;
    if (!exchange && s_.held_pages() + in_hand_ + slot.pages() > s_.limit_pages_) {
      req_.limit_hit = true;
      if (slot.count == 1) {
        rest.push_back(slot);
        break;
      }
      halve(slot);
      continue;
    }
    if (!exchange && slot.pages() > free_pages_) {  // what this request released is free again
      if (slot.count == 1) {
        stop_refused();
        rest.push_back(slot);
        break;
      }
      halve(slot);
      continue;
    }
    CUmemGenericAllocationHandle h = 0;
    if (s_.drv_.create(slot.pages() * s_.page_, &h) == CUDA_ERROR_OUT_OF_MEMORY) {
      if (slot.count == 1) {
        stop_refused();
        rest.push_back(slot);
        break;
      }
      if (!asked_free_) ask_free();
      halve(slot);
      continue;
    }
    if (exchange) {
      credit_ -= slot.pages();
    } else if (free_pages_ != SIZE_MAX) {
      free_pages_ -= std::min(free_pages_, slot.pages());
    }
    s_.note_created();
    take(slot, h);
    req_.created += slot.pages();
    s_.stats_.num_created_pages += slot.pages();
    s_.note_peaks(in_hand_);
  }
  rest.insert(rest.end(), open_.begin(), open_.end());
  open_.swap(rest);
}

void PageSupply::Gathering::reclaim_more(bool create) {
  if (open_.empty()) return;
  if (s_.streams_.has_unfinished_frees()) s_.streams_.poll(false);
  req_.reclaimed += s_.reclaim(open_pages());
  reclaimed_ = true;
  from_pool(false);
  // Remapping a small reclaimed handle into a larger slot costs a cuMemMap and a mapping's
  // share of cuMemSetAccess; releasing it and creating its pages as part of the slot's handle
  // can cost less by the cost model (2 MiB: ~24 us against ~62 us): exchange those.
  const size_t largest = largest_open();
  HandlePool& pool = s_.pool_;
  // Not with a reservation: from_reserve releases pooled handles for a slot as far as it needs
  // (one-page reserved handles are never exchanged: they serve any block without a cuMemCreate).
  while (s_.reserved_pages_ == 0 && !pool.empty() && pool.smallest() < largest &&
         s_.exchange_pays(pool.smallest())) {
    const size_t n = pool.smallest();
    s_.release_pooled(n);
    credit_ += n;
  }
  // The rest fill the slots, cut to their sizes. A reclaimed handle larger than every open slot
  // (reclaim() takes the smallest that covers what is left) is released and the slots' pages
  // created in its place: kept in the pool, it would hold memory beside the new pages.
  from_pool(true);
  if (!create) return;
  while (!open_.empty() && !pool.empty() && pool.largest() > largest && exchange_largest()) {
  }
  req_.create_oom = false;
  create_more();
  from_pool(true);
}

// Pooled handles no open slot can take are released, and new ones created in their place.
void PageSupply::Gathering::release_and_create() {
  while (!open_.empty()) {
    if (s_.pool_.empty() || s_.pool_.largest() <= largest_open() || !exchange_largest()) return;
    req_.create_oom = false;
    create_more();
    from_pool(true);
  }
}

}  // namespace expanse::core
