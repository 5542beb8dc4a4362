#include "core/device_allocator.hpp"

#include "core/streams/capture_announcements.hpp"
#include "core/base/check.hpp"
#include "core/base/format.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace expanse::core {
namespace {

// opts with every value derived from the device filled in: the page size (a multiple of the
// device's granularity, else expanse::usage_error), the reservations' sizes and the VA budget.
AllocatorOptions options_for(const DeviceDriver& drv, int device, AllocatorOptions opts) {
  const size_t g = drv.granularity();
  const size_t page = opts.page_size != 0 ? opts.page_size : g;
  if (page % g != 0) {
    throw usage_error("expanse: page_size " + conf::format_size(page) +
                      " is not a multiple of device " + std::to_string(device) +
                      "'s granularity " + conf::format_size(g));
  }
  opts.page_size = page;
  const size_t cap = round_up(std::max<size_t>(drv.total_memory(), page), page);
  if (opts.va_size == 0) opts.va_size = 2 * cap;
  if (opts.small_va_size == 0) opts.small_va_size = std::max<size_t>(cap / 4, size_t{1} << 30);
  opts.va_size = round_up(opts.va_size, page);
  opts.small_va_size = round_up(opts.small_va_size, page);
  if (opts.va_budget == 0) opts.va_budget = 64 * cap;
  if (opts.small_max > opts.small_va_size) opts.small_max = opts.small_va_size;
  return opts;
}

}  // namespace


DeviceAllocator::DeviceAllocator(const driver::LoadedDriver& drv, int device,
                                 const AllocatorOptions& opts)
    : drv_(drv, device, opts.rdma), opts_(options_for(drv_, device, opts)),
      page_(opts_.page_size), placement_(drv_, opts_, page_, stats_),
      streams_(drv_, placement_, opts_),
      supply_(drv_, placement_, streams_, stats_, opts_, page_), registrable_(drv_, page_),
      imports_(drv_),
      reserve_pending_(opts_.reserve_free || opts_.reserve_bytes >= page_),
      caches_([this](std::vector<CachedBlock>& blocks, ThreadCache& c) { give_back(blocks, c); }) {
  if (opts_.peer_access_auto) {
    int n = 0;
    drv.check(drv.table().device_get_count(&n), driver::EntryPoint::device_get_count);
    for (int p = 0; p < n; ++p) {
      if (drv_.can_access_peer(p)) drv_.add_peer(p);
    }
  }
}

DeviceAllocator::~DeviceAllocator() {
  caches_.detach_all();  // a thread exiting from now on gives nothing back here
  std::lock_guard<std::mutex> lock(mu_);
  // Shutdown: wait for all work, then give everything back. Errors are swallowed: at process exit
  // the driver may already be shutting down (CUDA_ERROR_DEINITIALIZED).
  try {
    streams_.poll(true);
  } catch (...) {
  }
  unmap_all_quietly();
  registrable_.free_all_quietly();
  imports_.close_all_quietly();
  supply_.release_pool_quietly();
  streams_.destroy_events();
  pools_.for_each([&](PoolSlot, const PoolState& p) { free_backup(p.backup); });
  free_orphan_backups_locked();
  drv_.destroy_stream(copy_stream_);
}

void DeviceAllocator::unmap_all_quietly() {
  placement_.for_each_reservation([&](Reservation& r) {
    for (const HandleRun& h : r.handles_in(0, r.page_count())) {
      try {
        supply_.unmap_handles(r, h.head, h.end());
      } catch (...) {
      }
    }
    try {
      drv_.address_free(r.base, r.size);
    } catch (...) {
    }
  });
}

// ---- peer access ----------------------------------------------------------------------------

void DeviceAllocator::enable_peer_access(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer == device() || drv_.has_peer(peer)) return;
  if (!drv_.can_access_peer(peer)) {
    throw usage_error("expanse: enable_peer_access(" + std::to_string(device()) + ", " +
                      std::to_string(peer) + "): the driver says device " +
                      std::to_string(peer) + " cannot access device " +
                      std::to_string(device()) + "'s memory (cuDeviceCanAccessPeer)");
  }
  drv_.add_peer(peer);
  try {
    grant_peer(peer);
    registrable_.grant_all();
    imports_.grant_all();
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: granting device " + std::to_string(peer) +
                             " access to device " + std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

// Present mappings: one cuMemSetAccess per run of accessible pages (all descriptors again).
void DeviceAllocator::grant_peer(int /*peer*/) {
  placement_.for_each_reservation([&](Reservation& r) {
    size_t run = 0, end = 0, mappings = 0;  // the run of accessible handles [run, end)
    auto grant = [&] {
      if (mappings != 0) drv_.set_access(r.page_addr(run), (end - run) * page_, mappings);
      mappings = 0;
    };
    for (const HandleRun& h : r.handles_in(0, r.page_count())) {
      if (!r.ready(h.head)) {
        grant();
        continue;
      }
      if (mappings == 0 || h.head != end) {
        grant();
        run = h.head;
      }
      end = h.end();
      ++mappings;
    }
    grant();
  });
}

std::vector<int> DeviceAllocator::peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drv_.peers();
}

// ---- allocate --------------------------------------------------------------------------------

void* DeviceAllocator::allocate(size_t bytes, CUstream stream, PoolId pool) {
  if (bytes == 0) return nullptr;
  if (bytes > SIZE_MAX / 2) {
    throw usage_error("expanse: allocation size " + std::to_string(bytes) +
                      " bytes on device " + std::to_string(device()) +
                      " overflows (larger than half the address space)");
  }
  const size_t sz = round_up(bytes, kBlockAlignment);
  const Arena a = placement_.arena_for(sz);
  // Which stream this is, asked before the lock (one cuStreamGetId): a handle value names
  // nothing by itself (recycled after cuStreamDestroy, per thread for CU_STREAM_PER_THREAD).
  const StreamIdentity id = streams_.identify(stream, "allocate", nullptr);
  if (pool == 0) {
    if (void* p = take_cached(bytes, id)) return p;  // device_front.cpp: no lock
  }

  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "allocate");
  settle_owed_locked();
  const PoolSlot slot = pool == 0 ? kDefaultPool : pools_.find(pool, "allocate", device(), true);
  if (slot != kDefaultPool && pools_.at(slot).asleep) {
    throw usage_error("expanse: allocate of " + std::to_string(bytes) + " bytes in pool " +
                      std::to_string(pool) + " on device " + std::to_string(device()) +
                      ": the pool is asleep (wake it first); nothing was changed");
  }
  if (reserve_pending_) reserve_pending_locked();
  if ((slot != kDefaultPool && pools_.at(slot).registrable) ||
      (slot == kDefaultPool && opts_.registrable)) {
    return allocate_registrable(bytes, pool, stream);
  }
  StreamOrder::Call call(streams_);
  StreamOrder::StreamState& ss = streams_.state(stream, id);
  streams_.fence_if_owed(ss);  // frees of it that others wait for (stream_watch.cpp)
  // Where this stream's allocation went the last time it was at this point of its workload
  // (a settled layout repeats), else where this stream freed a block of this size lately.
  // A point is named by the stream's live blocks the books see: all of them, or with thread
  // caches (whose hits the books do not see) the large arena's.
  const uint32_t refs = thread_caches_on() ? ss.large_refs : ss.live_refs;
  const uint64_t ref_bytes = thread_caches_on() ? ss.large_bytes : ss.live_bytes;
  const uint64_t point = echo_.point(sz, ss.key, refs, ref_bytes);
  const uint64_t short_point = echo_.short_point(sz, ss.key, refs, ref_bytes);
  if (a == Arena::large) {
    shape_.allocation(sz, ss.large_refs, echo_.known(point));
    if (shape_.varies()) supply_.set_refine(true);
    // Handles a varying workload's block boundaries would cut, cut now (once).
    if (slot == kDefaultPool) supply_.refine_freed(ss.key);
  }
  BlockIt reused = placement_.index().end();
  if (slot == kDefaultPool) reused = place_echoed(point, short_point, sz, a, ss);
  if (reused == placement_.index().end()) {
    reused = placement_.reuse_recent(ss.recent, ss.key, sz, a, supply_.pages_left(), slot);
  }
  if (reused != placement_.index().end()) {
    make_live(reused, bytes, ss, stream);
    echo_.remember(point, reused->first);
    echo_.remember_short(short_point, point, reused->first);
    if (a == Arena::large) note_large(sz, false);
    return reinterpret_cast<void*>(reused->first);
  }

  StreamOrder::Hold hold(streams_, ss);
  PageRequest req;
  req.bytes = bytes;
  req.stream = stream;
  try {
    BlockIt it = place(sz, a, ss.key, req, slot);
    make_live(it, bytes, ss, stream);
    echo_.remember(point, it->first);
    echo_.remember_short(short_point, point, it->first);
    // Its own size: a block that took reserved handles whole is larger than asked.
    if (placement_.arena_of(it->second) == Arena::large) note_large(it->second.size, false);
    return reinterpret_cast<void*>(it->first);
  } catch (const out_of_memory&) {
    ++stats_.num_ooms;
    if (events_ != nullptr) events_->on_oom(device(), bytes, stream, supply_.pages_left() * page_);
    throw;
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: allocating " + std::to_string(bytes) + " bytes on device " +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

// The echo (docs/design.md, "Settling on a repeated workload"): a block of sz bytes at one of
// the addresses the allocation at `point` (if never met: at `short_point`) had lately, where
// that needs no driver call.
BlockIt DeviceAllocator::place_echoed(uint64_t point, uint64_t short_point, size_t sz, Arena a,
                                      const StreamOrder::StreamState& ss) {
  std::vector<StreamKey> not_proven;  // asked once per allocation
  const auto targets =
      echo_.known(point) ? echo_.recall(point) : echo_.recall_short(short_point);
  for (CUdeviceptr at : targets) {
    if (at == 0) break;
    BlockIt it = placement_.place_at(at, ss.key, sz, a, supply_.pages_left());
    // Other streams' frees there may be done: their fences are asked (no record, no wait).
    if (it == placement_.index().end() && streams_.has_unfinished_frees() &&
        streams_.prove_for(at, sz, ss.key, &not_proven)) {
      it = placement_.place_at(at, ss.key, sz, a, supply_.pages_left());
    }
    if (it != placement_.index().end()) return it;
  }
  return placement_.index().end();
}

// A block of sz bytes for `stream` in `pool`, carved and backed by mapped, accessible pages (not
// yet live); on a throw nothing changed. When the pages are not to be had, the thread caches
// give their blocks back, released pools whose work can be proven done now give their memory
// back, and the placement is tried once more.
BlockIt DeviceAllocator::place(size_t sz, Arena a, StreamKey stream, PageRequest& req,
                               PoolSlot pool) {
  // Parked blocks hold touched pages: a request the reservation covers once they are given back
  // must not create memory beyond it.
  if (supply_.reserved_pages() > 0 && !caches_.empty() &&
      supply_.touched_pages() + (sz + page_ - 1) / page_ > supply_.reserved_pages()) {
    flush_caches_locked();
  }
  // A small block that finds no mapped place: the blocks parked in thread caches (all of the
  // small arena) go back first, so that the pages they hold serve it rather than new ones (parked
  // blocks scattered over the arena's pages would otherwise keep it growing).
  if (a == Arena::small && pool == kDefaultPool && !caches_.empty()) {
    size_t offset = 0;
    if (placement_.find_ready(sz, a, stream, supply_.pages_left(), &offset) ==
        placement_.index().end()) {
      flush_caches_locked();
    }
  }
  try {
    return place_once(sz, a, stream, req, pool);
  } catch (const out_of_memory&) {
    // Memory parked in any thread's cache is free memory: none is reported missing while some is.
    const bool flushed = flush_caches_locked() != 0;
    if (!return_released_pools() && !flushed && !supply_.guards_reserve()) throw;
  }
  try {
    return place_once(sz, a, stream, req, pool);
  } catch (const out_of_memory&) {
    // A request the reservation covers fails only when its pages do not exist.
    const size_t need = (sz + page_ - 1) / page_;
    if (!supply_.guards_reserve() ||
        supply_.touched_pages() + supply_.outside_pages() + supply_.retired_pages() + need >
            supply_.reserved_pages()) {
      throw;
    }
    BlockIt it = place_whole_handles(sz, stream, req, pool);
    if (it == placement_.index().end()) throw;
    return it;
  }
}

BlockIt DeviceAllocator::place_whole_handles(size_t sz, StreamKey stream, PageRequest& req,
                                             PoolSlot pool) {
  const BlockIt none = placement_.index().end();
  const size_t need = (sz + page_ - 1) / page_;
  streams_.poll(true);  // every safe page may serve it
  req.waited = true;
  const std::vector<size_t> sizes = supply_.whole_handles_for(need);
  if (sizes.empty()) return none;
  size_t pages = 0;
  for (size_t n : sizes) pages += n;
  const size_t span = pages * page_;
  size_t offset = 0;
  BlockIt it = placement_.find_unmapped(span, stream, &offset);
  if (it == none) {
    Reservation* fresh = placement_.add_reservation(Arena::large, span);
    if (fresh == nullptr) return none;
    it = placement_.index().blocks().find(fresh->base);
    offset = 0;
  }
  const PoolSlot from = it->second.pool;
  it = placement_.index().carve(it, span, Arena::large, offset);
  it->second.state = BlockState::live;
  it->second.pool = pool;
  Reservation& r = placement_.res(it->second.res);
  try {
    supply_.map_whole(r, r.first_page(it->first), sizes);
    stranded_.emplace(it->first, pages - need);
  } catch (...) {
    it->second.pool = from;
    placement_.index().insert_free(it, Arena::large);
    throw;
  }
  stranded_pages_ += pages - need;
  return it;
}

// The pool's own free memory (mapped, used in place), then the default pool's (found the
// default way: best fit, fresh VA), carved into the pool.
BlockIt DeviceAllocator::place_once(size_t sz, Arena a, StreamKey stream, PageRequest& req,
                                    PoolSlot pool) {
  // A placement touches at least ceil(sz / page) pages, at most two of them already touched:
  // when even that does not fit, fail before reserving, creating, reclaiming or waiting.
  const size_t max_new = (sz + page_ - 1) / page_;
  if (max_new > 2 && max_new - 2 > supply_.pages_left()) {
    req.hopeless = true;
    req.needed = max_new;
    throw_oom(req);
  }
  size_t offset = 0;
  size_t span = sz;  // what is carved
  BlockIt it = placement_.index().end();
  if (pool == kDefaultPool) {
    it = find_block(sz, a, stream, req, &offset);
  } else {
    it = placement_.find_in_pool(sz, a, stream, pool, supply_.pages_left(), &offset);
    if (it == placement_.index().end()) {
      // A pool takes the default pool's memory in whole pages, so that no page of it holds
      // another pool's block: its pages can then be pinned, trimmed and counted as its own.
      span = round_up(sz, page_);
      it = find_block(span, a, stream, req, &offset, true);
    }
  }
  // A free block this stream may use now, holding the placement.
  EXPANSE_ASSERT(it->second.state == BlockState::free &&
                 (it->second.safe || it->second.stream == stream) &&
                 offset + span <= it->second.size &&
                 (it->second.pool == kDefaultPool || it->second.pool == pool));
  const PoolSlot from = it->second.pool;
  it = placement_.index().carve(it, span, a, offset);
  // Live before ensure_pages: out of the index, reclaim cannot pick its pages, and a poll there
  // cannot merge it away (a merge erases free blocks only), so `it` stays valid across it.
  it->second.state = BlockState::live;
  it->second.pool = pool;
  Reservation& r = placement_.res(it->second.res);
  try {
    const size_t fresh = r.untouched_pages(it->first, span);
    if (fresh > supply_.pages_left()) {
      req.limit_hit = supply_.limit_pages() < supply_.capacity_pages();
      req.hopeless = true;
      req.needed = fresh;
      throw_oom(req);
    }
    // The block and the rest of its pages apart: a multi-page handle lies inside one block's
    // inner pages (reservation.hpp), and the rest stays the pool's free memory, mapped.
    // A pool's memory takes one-page handles: nothing splits a live pool's handles (a graph may
    // address the pages), so only these let it place any block in its free memory again.
    // A varying workload's large blocks, too: their boundaries may fall anywhere next step.
    const size_t max_handle =
        pool != kDefaultPool || (a == Arena::large && supply_.refining()) ? 1 : 0;
    if (!supply_.ensure_pages(r, it->first, sz, req, max_handle)) throw_oom(req);
    if (span > sz && !supply_.ensure_pages(r, it->first + sz, span - sz, req, max_handle)) {
      throw_oom(req);
    }
  } catch (...) {
    it->second.pool = from;
    placement_.index().insert_free(it, a);
    throw;
  }
  if (span > sz) placement_.index().split_tail(it, sz, a);
  return it;
}

// Chooses where a block of sz bytes goes: a free block this stream may use, and the offset into
// it. The best fit, as PyTorch's allocator chooses (placement.hpp): in it, a place that needs no
// driver call (unless handles are being refined: every place is then as good); else its tight
// place, whose missing pages PageSupply::ensure_pages provides, splitting the free handles it
// covers in part; then fresh VA. Before mapping memory or splitting a handle, the fences of
// freed memory are asked (frees of other streams may be done by now, and a split needs the work
// that used the memory proven done). A split of the stream's own memory that the fences do not
// prove waits for that stream's work rather than going elsewhere: placements then do not depend
// on how far the GPU runs behind (going elsewhere maps memory that a GPU keeping up would not
// need).
BlockIt DeviceAllocator::find_block(size_t sz, Arena a, StreamKey stream, PageRequest& req,
                                    size_t* offset, bool whole_pages) {
  const BlockIt none = placement_.index().end();
  for (bool asked = false;; asked = true) {
    if (!whole_pages && (a == Arena::small || !supply_.refining())) {
      BlockIt ready = placement_.find_ready(sz, a, stream, supply_.pages_left(), offset);
      if (ready != none) return ready;
    }
    BlockIt it = placement_.find_tight(sz, a, stream, SIZE_MAX, offset, whole_pages, true);
    const bool proven =
        it != none && placement_.handles_fit(it, *offset, sz, Placement::HandleFit::splittable);
    // Asked only where an answer may change the placement: memory other streams freed may be
    // usable now; a split needs the work on the memory it unmaps proven done. The stream's own
    // free memory is its to use already.
    if (!asked && ((it != none && !proven) || (streams_.others_have_unfinished_frees(stream) &&
                                               (it == none || !placement_.mapped_at(it, *offset, sz))))) {
      streams_.poll(false);
      continue;
    }
    if (it != none && !proven) {
      // Unproven memory a best fit may take is this stream's own (first_fit_where): its own
      // fence is waited for, nothing else. What that cannot prove (a capture under way, another
      // thread's stream) goes to the best fit that needs no such split.
      if (streams_.prove_own(stream)) req.waited = true;
      it = placement_.find_tight(sz, a, stream, SIZE_MAX, offset, whole_pages);
    }
    if (it != none) return it;
    break;
  }
  Reservation* fresh = placement_.add_reservation(a, sz);
  if (fresh != nullptr) {
    *offset = 0;
    return placement_.index().blocks().find(fresh->base);
  }
  // Out of VA budget: free memory owned by other streams may be all that is left.
  streams_.poll(true);
  req.waited = true;
  BlockIt it = placement_.find_tight(sz, a, stream, SIZE_MAX, offset, whole_pages);
  if (it != none) return it;
  req.va_exhausted = true;
  throw_oom(req);
}

void DeviceAllocator::make_live(BlockIt it, size_t requested, StreamOrder::StreamState& ss,
                                CUstream stream) {
  Block& b = it->second;
  Reservation& r = placement_.res(b.res);
  // Every page of a live block is mapped and accessible (docs/design.md, invariant 2).
  EXPANSE_ASSERT(r.all_ready(r.first_page(it->first), r.last_page(it->first, b.size)));
  b.state = BlockState::live;
  b.requested = requested;
  streams_.on_alloc(b, ss);
  supply_.touch(r, it->first, b.size);
  if (r.arena == Arena::large) ++large_live_;
  if (b.pool != kDefaultPool) count_in_pool(b, +1);
  stats_.requested_bytes += requested;
  stats_.allocated_bytes += b.size;
  ++stats_.live_blocks;
  ++stats_.num_allocs;
  peaks_after_allocation_locked();
  if (events_ != nullptr) events_->on_alloc(device(), it->first, requested, stream);
}

// ---- free ------------------------------------------------------------------------------------

void DeviceAllocator::deallocate(void* ptr, CUstream stream, size_t expected_size, PoolId join) {
  if (ptr == nullptr) return;
  const StreamIdentity id = streams_.identify(stream, "free", ptr);
  if (join == 0 && park_fast(ptr, id, expected_size)) return;  // device_front.cpp: no lock
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "free");
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  if (registrable_.find(addr) != nullptr) return free_registrable(addr, stream, expected_size);
  if (const FrontBlocks::Entry* e = caches_.blocks().find(addr);
      e != nullptr && e->state.load(std::memory_order_acquire) == FrontBlocks::cached) {
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      ": a block that is not live (freed already: a thread cache holds it; "
                      "double free); nothing was changed");
  }
  auto it = placement_.index().blocks().find(addr);
  const bool asleep = it != placement_.index().blocks().end() &&
                      it->second.state == BlockState::asleep;
  if (it == placement_.index().blocks().end() ||
      (it->second.state != BlockState::live && !asleep)) {
    const bool known = it != placement_.index().blocks().end();
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      ": " + (known ? "a block that is not live" : describe_pointer_locked(ptr)) +
                      " (double free, or not a pointer expanse returned); nothing was changed");
  }
  Block& b = it->second;
  if (expected_size != 0 && expected_size != b.requested) {
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      " with size " + std::to_string(expected_size) +
                      ", but it was allocated with size " + std::to_string(b.requested) +
                      "; nothing was changed");
  }
  StreamOrder::Call call(streams_);
  StreamOrder::StreamState& ss = streams_.state(stream, id);
  settle_owed_locked();
  // Out of host memory the free fails here (std::bad_alloc), before anything changed: the
  // block stays live, and freeing it again may succeed. From here on it completes.
  StreamOrder::Deps deps = streams_.make_room_for_free(b, ss);
  const PoolSlot join_slot = join != 0 ? pools_.live_slot(join) : kDefaultPool;
  if (join_slot != kDefaultPool) placement_.index().make_room(join_slot);
  if (b.pool != kDefaultPool) make_room_if_emptying(b);
  // The check above read the entry; a free racing on another thread (park_fast) may have parked
  // the block since: only one of the two frees may have it.
  if (!caches_.blocks().seize(addr)) {
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      ": a block another thread freed at the same time (a thread cache holds "
                      "it; double free); nothing was changed");
  }
  if (join == 0 && !asleep && park_locked(it, ss, id)) return;
  caches_.blocks().erase(addr);  // back in the books for good (if it ever was parked)
  credit_free(b.size, b.requested);
  deps = streams_.end_uses(b, ss, std::move(deps));
  if (placement_.arena_of(b) == Arena::large) note_large(b.size, true);
  const bool large = placement_.arena_of(b) == Arena::large;  // b may merge away in on_free
  bool cut_after = false;  // large handles under it to cut into pages (PageSupply::note_freed)
  if (asleep) {
    b.state = BlockState::live;  // freed as a live block; its pages are gone (not touched)
  } else {
    supply_.untouch(placement_.res(b.res), it->first, b.size);
    cut_after = b.pool == kDefaultPool && large &&
                supply_.note_freed(placement_.res(b.res), it->first, b.size, !deps.empty());
  }
  PoolSlot emptied = kDefaultPool;  // a returned pool this free leaves with no live block
  if (b.pool != kDefaultPool) {
    const PoolSlot s = b.pool;
    count_in_pool(b, -1);
    if (pools_.at(s).returned) {  // its memory is the default pool's now
      b.pool = kDefaultPool;
      if (pools_.at(s).live_blocks == 0) emptied = s;
    }
  } else if (join != 0) {
    b.pool = join_slot;
  }
  stats_.requested_bytes -= b.requested;
  stats_.allocated_bytes -= b.size;
  --stats_.live_blocks;
  ++stats_.num_frees;
  if (!stranded_.empty()) {
    auto st = stranded_.find(it->first);
    if (st != stranded_.end()) {
      stranded_pages_ -= st->second;  // free memory now, cut to shape like any other
      stranded_.erase(st);
    }
  }
  if (events_ != nullptr) events_->on_free(device(), it->first, b.requested, stream);
  streams_.on_free(it, ss, std::move(deps));
  if (emptied != kDefaultPool) forget_pool(emptied);  // room made above: cannot throw
  if (cut_after) supply_.refine_freed(ss.key);  // best effort: never throws
  if (large && --large_live_ == 0 && !caches_.empty()) {
    // The application holds no large block: a workload that starts over (another run, another
    // model) starts from the books, not from small blocks the one before left parked, scattered
    // over the small arena's pages. Best effort: out of host memory they stay parked.
    try {
      flush_caches_locked();
    } catch (...) {
    }
  }
  trim_after_free();
  recheck_limit_locked();
}

// Cached memory above release_threshold goes back to the driver: what fences prove done now
// (they are asked, and recorded where a stream has none; nothing waits).
void DeviceAllocator::trim_after_free() {
  if (opts_.release_threshold == kNoLimit) return;
  const size_t cached_pages =
      supply_.mapped_pages() - supply_.touched_pages() + supply_.pooled_pages();
  if (cached_pages * page_ <= opts_.release_threshold) return;
  try {
    if (streams_.has_unfinished_frees()) streams_.poll(false);
    supply_.trim_to(supply_.touched_pages() + opts_.release_threshold / page_);
  } catch (...) {
    // Giving memory back is best effort; the free itself has happened.
  }
}

void DeviceAllocator::record_stream(void* ptr, CUstream stream) {
  const StreamIdentity id = streams_.identify(stream, "record_stream", ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  // A registrable block's free waits for the whole context: every stream is covered.
  if (registrable_.find(addr) != nullptr) return;
  auto it = placement_.index().blocks().find(addr);
  const FrontBlocks::Entry* parked = caches_.blocks().find(addr);
  if (it == placement_.index().blocks().end() || it->second.state != BlockState::live ||
      (parked != nullptr && parked->state.load(std::memory_order_acquire) == FrontBlocks::cached)) {
    throw usage_error("expanse: record_stream of " + hex(addr) + " on device " +
                      std::to_string(device()) + ": " + describe_pointer_locked(ptr) +
                      "; nothing was changed");
  }
  // Used by another stream: its free must wait for that stream, so it never enters a cache.
  // The check above read the entry without stopping a free on another thread (park_fast) from
  // parking the block since: its entry goes only while the user still holds it.
  if (!caches_.blocks().erase_unless_cached(addr)) {
    throw usage_error("expanse: record_stream of " + hex(addr) + " on device " +
                      std::to_string(device()) + ": a block another thread freed at the same " +
                      "time (a thread cache holds it); nothing was changed");
  }
  StreamOrder::Call call(streams_);
  StreamOrder::StreamState& ss = streams_.state(stream, id);
  streams_.fence_if_owed(ss);
  streams_.add_user(it->second, ss);
}

// ---- giving memory back ---------------------------------------------------------------------

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "release_cached");
  try {
    flush_caches_locked();
    return_released_pools();
    CaptureAnnouncements::run_unless_capturing(drv_.primary(), [&] {
      free_orphan_backups_locked();
      return true;
    });
    streams_.poll(true);
    supply_.trim_to(supply_.touched_pages());
    placement_.release_empty_reservations();
  } catch (const driver::driver_error& e) {
    throw driver_failure(std::string("expanse: release_cached on device ") +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "set_limit");
  if (bytes != kNoLimit && bytes / page_ < supply_.reserved_pages()) {
    throw usage_error("expanse: set_limit of " + conf::format_size(bytes) + " on device " +
                      std::to_string(device()) + " is below its reservation of " +
                      conf::format_size(supply_.reserved_pages() * page_) +
                      " (expanse_reserve less, or expanse_unreserve, first); nothing was changed");
  }
  flush_caches_locked();
  supply_.set_limit_pages(bytes == kNoLimit ? SIZE_MAX : bytes / page_);
  over_limit_.store(supply_.touched_pages() > supply_.limit_pages(), std::memory_order_release);
  if (supply_.held_pages() <= supply_.limit_pages()) return;
  try {
    streams_.poll(false);
    supply_.trim_to(std::max(supply_.limit_pages(), supply_.touched_pages()));
  } catch (const driver::driver_error& e) {
    throw driver_failure(std::string("expanse: set_limit on device ") +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

size_t DeviceAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return supply_.limit_pages() == SIZE_MAX ? kNoLimit : supply_.limit_pages() * page_;
}

}  // namespace expanse::core
