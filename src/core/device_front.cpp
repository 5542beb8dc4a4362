// DeviceAllocator's front: the thread caches (thread_cache.hpp) on the way into allocate() and
// deallocate(), and their way back into the books.
//
// What may be parked: a block of the default pool, live, freed on the stream it was allocated
// on, that no other stream used (record_stream), while no capture is announced and no pool route
// exists anywhere in the process (CacheBypass), on a stream that is not capturing and whose
// identity the driver gives (created, per-thread, legacy streams: StreamOrder's keys), with no
// memory history recorded. It is handed back only to its thread, on that same stream, for the
// same requested size: what StreamOrder's exact-size reuse would do under the lock, minus the
// lock. Everything else takes the locked path.
//
// Memory history: set_events marks the history on, then flushes every cache under its lock, so
// a park checks the mark again under the cache's lock. A park before the flush happened before
// recording began (the flush frees the block with no event: its free is no part of the trace);
// one after it sees the mark and takes the locked path, which records the free. Were it checked
// only before the lock, a park racing the start would leave its block parked while the history
// records, its free recorded late (at the next flush, on no stream). Hits need no second look:
// once the flush has passed a cache, nothing parks there to be hit.
//
// Peaks without the lock: a free through this allocator adds the bytes it frees to its thread's
// credit; an allocation from the cache that the credit covers cannot raise the users' peak (the
// bytes allocated are back to at most where they were when those frees were made) and spends it.
// Any other allocation computes the peak exactly under the lock (the books' allocated bytes less
// every parked block) and sets every thread's credit to 0.
#include "core/front/cache_bypass.hpp"
#include "core/device_allocator.hpp"
#include "core/base/format.hpp"

#include <algorithm>
#include <new>

namespace expanse::core {
namespace {

// Streams StreamOrder keys by their driver id, which the front can use without the lock.
bool cacheable(const StreamIdentity& id) noexcept {
  return id.kind == StreamIdentity::created || id.kind == StreamIdentity::per_thread ||
         id.kind == StreamIdentity::legacy;
}

}  // namespace

bool DeviceAllocator::front_open() const noexcept {
  return thread_caches_on() && !history_on_.load(std::memory_order_acquire) &&
         !over_limit_.load(std::memory_order_acquire) && !CacheBypass::active();
}

void DeviceAllocator::recheck_limit_locked() {
  if (over_limit_.load(std::memory_order_relaxed) &&
      supply_.touched_pages() <= supply_.limit_pages()) {
    over_limit_.store(false, std::memory_order_release);
  }
}

void* DeviceAllocator::take_cached(size_t bytes, const StreamIdentity& id) {
  if (!cacheable(id) || !front_open()) return nullptr;
  ThreadCache* c = caches_.mine(false);
  if (c == nullptr) return nullptr;
  CachedBlock b;
  bool covered = false;
  {
    std::lock_guard<SpinLock> lock(c->lock);
    const StreamKey key = id.id;
    if (key == 0 || !c->take(key, bytes, &b)) return nullptr;
    ++c->hits;
    c->queries += id.queries;
    covered = c->credit_size >= b.size && c->credit_requested >= b.requested;
    if (covered) {
      c->credit_size -= b.size;
      c->credit_requested -= b.requested;
    }
    // Under the lock: once a flush has passed this cache, the entry says the user holds it
    // (segments() shows a live block whose entry says cached as freed, as users see it).
    b.entry->state.store(FrontBlocks::live, std::memory_order_release);
  }
  if (!covered) {
    std::lock_guard<std::mutex> lock(mu_);
    update_peaks_locked();
  }
  return reinterpret_cast<void*>(b.addr);
}

bool DeviceAllocator::park_fast(void* ptr, const StreamIdentity& id, size_t expected_size) {
  if (!cacheable(id) || !front_open()) return false;
  // A thread's first park takes the locked path, which makes its cache.
  ThreadCache* c = caches_.mine(false);
  if (c == nullptr) return false;
  const StreamKey key = id.id;
  if (key == 0) return false;
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  FrontBlocks::Entry* e = nullptr;
  if (caches_.blocks().claim(addr, key, expected_size, &e) != FrontBlocks::Claim::claimed) {
    return false;  // the locked path says what is wrong, or frees it there
  }
  std::vector<CachedBlock> evicted;
  try {
    std::lock_guard<SpinLock> lock(c->lock);
    if (history_on_.load(std::memory_order_acquire)) {  // see the top
      e->state.store(FrontBlocks::live, std::memory_order_release);  // the locked path frees it
      return false;
    }
    c->put(key, CachedBlock{addr, e->size, e->requested, e, 0}, opts_.thread_cache_bytes,
           opts_.thread_cache_entries, &evicted);
    c->credit_size += e->size;
    c->credit_requested += e->requested;
    c->queries += id.queries;
  } catch (const std::bad_alloc&) {
    e->state.store(FrontBlocks::live, std::memory_order_release);  // the locked path frees it
    return false;
  }
  if (!evicted.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    CheckedScope checked(*this, "free");
    settle_owed_locked();
    free_parked_all_locked(evicted);
  }
  return true;
}

bool DeviceAllocator::park_locked(BlockIt it, StreamOrder::StreamState& ss,
                                  const StreamIdentity& id) {
  const Block& b = it->second;
  // Only the small-block arena's blocks: a large block holds whole pages that placement and the
  // echo must see free (parked, they are held beside the pages the next larger block maps, and
  // its next allocation at another point of the workload misses its settled place).
  if (!cacheable(id) || !front_open() || b.pool != kDefaultPool || !b.users.empty() ||
      b.stream != ss.key || b.size > opts_.thread_cache_bytes ||
      placement_.arena_of(b) != Arena::small) {
    return false;
  }
  ThreadCache* c = caches_.mine(true);
  if (c == nullptr) return false;  // the thread is exiting
  std::vector<CachedBlock> evicted;
  try {
    FrontBlocks::Entry* e =
        caches_.blocks().insert_cached(it->first, ss.key, b.size, b.requested);
    std::lock_guard<SpinLock> lock(c->lock);
    c->put(ss.key, CachedBlock{it->first, b.size, b.requested, e, 0}, opts_.thread_cache_bytes,
           opts_.thread_cache_entries, &evicted);
    c->credit_size += b.size;
    c->credit_requested += b.requested;
  } catch (const std::bad_alloc&) {
    caches_.blocks().erase(it->first);  // not parked: freed the usual way
    return false;
  }
  free_parked_all_locked(evicted);
  return true;
}

void DeviceAllocator::free_parked_locked(CUdeviceptr addr) {
  auto it = placement_.index().blocks().find(addr);
  EXPANSE_ASSERT(it != placement_.index().blocks().end() &&
                 it->second.state == BlockState::live);
  Block& b = it->second;
  StreamOrder::StreamState* ss = streams_.find_state(b.stream);
  EXPANSE_ASSERT(ss != nullptr);  // its live block keeps the state
  // The only step that may fail (out of host memory): before anything changes.
  StreamOrder::Deps deps = streams_.end_uses(b, *ss, streams_.make_room_for_free(b, *ss));
  caches_.blocks().erase(addr);
  supply_.untouch(placement_.res(b.res), it->first, b.size);
  stats_.requested_bytes -= b.requested;
  stats_.allocated_bytes -= b.size;
  --stats_.live_blocks;
  ++stats_.num_frees;
  // No history event: nothing parks while the history records (see the top), so the user freed
  // this block before recording began.
  streams_.on_free(it, *ss, std::move(deps));
}

// A block evicted or flushed is out of its cache: from there it is freed into the books, or,
// out of host memory, marked owed (no allocation) and freed by the next settle_owed_locked. So
// no block a user freed stays live for good, and no free the user saw succeed throws.
size_t DeviceAllocator::free_parked_all_locked(const std::vector<CachedBlock>& blocks) {
  size_t freed = 0;
  try {
    for (; freed < blocks.size(); ++freed) free_parked_locked(blocks[freed].addr);
  } catch (const std::bad_alloc&) {
    for (size_t i = freed; i < blocks.size(); ++i) {
      blocks[i].entry->owed = true;
      ++owed_frees_;
      owed_bytes_ += blocks[i].size;
      owed_requested_ += blocks[i].requested;
    }
  }
  if (freed != 0) trim_after_free();
  return freed;
}

size_t DeviceAllocator::settle_owed_locked() {
  if (owed_frees_ == 0) return 0;
  size_t freed = 0;
  try {
    for (CUdeviceptr addr : caches_.blocks().owed()) {
      const FrontBlocks::Entry* e = caches_.blocks().find(addr);
      const size_t size = e->size, requested = e->requested;
      free_parked_locked(addr);  // erases e
      --owed_frees_;
      owed_bytes_ -= size;
      owed_requested_ -= requested;
      ++freed;
    }
  } catch (const std::bad_alloc&) {
    // Still owed: the next locked call tries again.
  }
  if (freed != 0) trim_after_free();
  return freed;
}

size_t DeviceAllocator::flush_caches_locked() {
  const size_t settled = settle_owed_locked();
  if (caches_.empty()) return settled;
  std::vector<CachedBlock> all;
  try {
    caches_.for_each(
        [&](ThreadCache& c) {
          std::lock_guard<SpinLock> lock(c.lock);
          // Out of host memory, this cache (and those after it) keeps its blocks: the room for
          // them in `all` is made before any is taken.
          if (all.capacity() - all.size() < c.entries()) {
            all.reserve(std::max(2 * all.capacity(), all.size() + c.entries()));
          }
          std::vector<CachedBlock> mine = c.take_all();
          all.insert(all.end(), mine.begin(), mine.end());
          absorb_counts_locked(c);
        },
        /*prune=*/true);
  } catch (const std::bad_alloc&) {
    // The blocks taken so far are freed below.
  }
  return settled + free_parked_all_locked(all);
}

DeviceAllocator::ParkedShare DeviceAllocator::parked_share_locked(bool zero_credits) {
  ParkedShare share;
  settle_owed_locked();  // out of host memory, some stay owed: freed as users see them, below
  if (caches_.empty() && owed_frees_ == 0) return share;
  // A block's inner pages are its own; its first and last pages stop being touched only when
  // every live block with an edge there is parked (Reservation::untouch).
  std::vector<std::pair<uint32_t, size_t>> edges;  // (reservation, page), one per parked edge
  auto add = [&](CUdeviceptr addr, size_t size, size_t requested) {
    auto it = placement_.index().blocks().find(addr);
    EXPANSE_ASSERT(it != placement_.index().blocks().end() &&
                   it->second.state == BlockState::live);
    const Reservation& r = placement_.res(it->second.res);
    const size_t a = r.first_page(addr), z = r.last_page(addr, size);
    edges.emplace_back(it->second.res, a);
    if (z != a) {
      edges.emplace_back(it->second.res, z);
      share.pages += z - a - 1;
    }
    ++share.blocks;
    share.bytes += size;
    share.requested += requested;
  };
  caches_.for_each([&](ThreadCache& c) {
    std::lock_guard<SpinLock> lock(c.lock);
    absorb_counts_locked(c);
    if (zero_credits) c.credit_size = c.credit_requested = 0;
    c.for_each_block([&](const CachedBlock& cb) { add(cb.addr, cb.size, cb.requested); });
  });
  if (owed_frees_ != 0) {
    for (CUdeviceptr addr : caches_.blocks().owed()) {
      const FrontBlocks::Entry* e = caches_.blocks().find(addr);
      add(addr, e->size, e->requested);
    }
  }
  std::sort(edges.begin(), edges.end());
  for (size_t i = 0; i < edges.size();) {
    size_t j = i;
    while (j < edges.size() && edges[j] == edges[i]) ++j;
    if (placement_.res(edges[i].first).edge_refs[edges[i].second] == j - i) ++share.pages;
    i = j;
  }
  return share;
}

// Each hit was an allocation and a free the books never saw; its stream queries, driver calls.
void DeviceAllocator::absorb_counts_locked(ThreadCache& c) {
  stats_.num_allocs += c.hits;
  stats_.num_frees += c.hits;
  stats_.thread_cache_hits += c.hits;
  drv_.add_stream_queries(c.queries);
  c.hits = c.queries = 0;
}

void DeviceAllocator::give_back(std::vector<CachedBlock>& blocks, ThreadCache& c) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "thread exit");
  StreamOrder::ThreadExit exiting(streams_);
  {
    std::lock_guard<SpinLock> l(c.lock);
    absorb_counts_locked(c);
  }
  settle_owed_locked();
  free_parked_all_locked(blocks);
}

void DeviceAllocator::update_peaks_locked() {
  uint64_t parked = 0, parked_requested = 0;
  caches_.for_each([&](ThreadCache& c) {
    std::lock_guard<SpinLock> lock(c.lock);
    parked += c.bytes();
    parked_requested += c.requested_bytes();
    c.credit_size = c.credit_requested = 0;
  });
  parked += owed_bytes_;
  parked_requested += owed_requested_;
  stats_.peak_allocated_bytes =
      std::max<uint64_t>(stats_.peak_allocated_bytes, stats_.allocated_bytes - parked);
  stats_.peak_requested_bytes =
      std::max<uint64_t>(stats_.peak_requested_bytes, stats_.requested_bytes - parked_requested);
}

void DeviceAllocator::peaks_after_allocation_locked() {
  if (!caches_.empty()) {
    update_peaks_locked();
    return;
  }
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

void DeviceAllocator::credit_free(size_t size, size_t requested) {
  if (caches_.empty()) return;
  ThreadCache* c = caches_.mine(false);
  if (c == nullptr) return;
  std::lock_guard<SpinLock> lock(c->lock);
  c->credit_size += size;
  c->credit_requested += requested;
}

}  // namespace expanse::core
