// Per-thread caches of freed blocks, one per (thread, device allocator): the allocator's front
// (docs/design.md, "Thread caches"). A block freed on stream S goes to the freeing thread's cache
// under (S, requested size) and is handed to that thread's next allocation of the same size on S
// without the device lock: same-stream reuse, which needs no event (stream order alone keeps the
// new user's work after the old one's), as the allocator's exact-size reuse already does.
//
// A cached block stays live in the allocator's books; the cache is bounded (bytes, entries:
// EXPANSE_CONF thread_cache, thread_cache_entries) and every cache can be flushed back by any
// thread holding the device lock (pressure, stats, release_cached, ...). Lock order: the
// lifetime lock (thread exit, allocator destruction) -> the device lock -> the registry lock ->
// one cache's lock -> a FrontBlocks shard. The owning thread takes only its cache's lock on the
// fast path, uncontended but for a flush.
#pragma once

#include "core/placement/block_index.hpp"
#include "core/front/front_blocks.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace expanse::core {

// A test-and-test-and-set lock: a cache's lock is taken by its own thread on every fast
// allocation and free, and by another thread only to flush it.
class SpinLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

struct CachedBlock {
  CUdeviceptr addr = 0;
  size_t size = 0;       // as carved
  size_t requested = 0;  // as asked for (the cache key with the stream)
  FrontBlocks::Entry* entry = nullptr;
  uint64_t stamp = 0;    // when parked (the oldest is evicted first)
};

class ThreadCaches;

// One thread's cache for one allocator. Every member is guarded by `lock`.
class ThreadCache {
 public:
  // The most recently parked block of (key, requested), if any; removed.
  bool take(StreamKey key, size_t requested, CachedBlock* out);
  // Parks b under (key, b.requested); then evicts the oldest blocks until at most max_bytes and
  // max_entries are held (they go to *evicted, to be freed by the caller). On a throw
  // (std::bad_alloc) nothing was parked or evicted.
  void put(StreamKey key, const CachedBlock& b, size_t max_bytes, size_t max_entries,
           std::vector<CachedBlock>* evicted);
  // Every block, removed.
  std::vector<CachedBlock> take_all();
  // f(block) for every block, left parked.
  template <class F>
  void for_each_block(F&& f) const {
    for (const Bin& bin : bins_) {
      for (const CachedBlock& b : bin.blocks) f(b);
    }
  }
  size_t bytes() const noexcept { return bytes_; }
  size_t requested_bytes() const noexcept { return requested_; }
  size_t entries() const noexcept { return entries_; }

  mutable SpinLock lock;
  ThreadCaches* owner = nullptr;  // nullptr once the allocator is gone
  bool thread_gone = false;       // its thread exited: the registry drops it at the next flush
  // Peak credit (DeviceAllocator: peaks without the lock): bytes this thread freed since the
  // peak was last computed exactly; an allocation covered by them cannot raise the peak.
  uint64_t credit_size = 0;
  uint64_t credit_requested = 0;
  // Allocations served here (each one allocation and one free the allocator never saw) and the
  // stream queries they made: folded into the allocator's stats when read or at a flush.
  uint64_t hits = 0;
  uint64_t queries = 0;

 private:
  struct Bin {
    StreamKey key = 0;
    size_t requested = 0;
    std::vector<CachedBlock> blocks;  // oldest first
  };
  std::vector<Bin> bins_;
  size_t bytes_ = 0;
  size_t requested_ = 0;
  size_t entries_ = 0;
  uint64_t clock_ = 0;
};

// The caches of one allocator: which thread has which, and every one for a flush.
class ThreadCaches {
 public:
  // give_back(blocks, cache): a thread exited with blocks parked (called without any lock held
  // but the lifetime lock: it takes the device lock).
  using GiveBack = std::function<void(std::vector<CachedBlock>&, ThreadCache&)>;
  explicit ThreadCaches(GiveBack give_back);
  // Detaches every cache: a thread exiting later frees nothing through this allocator.
  ~ThreadCaches();
  ThreadCaches(const ThreadCaches&) = delete;
  ThreadCaches& operator=(const ThreadCaches&) = delete;

  // Detaches every cache (idempotent): a thread exiting later gives nothing back here.
  void detach_all();
  // The calling thread's cache (nullptr without create, if it has none yet).
  ThreadCache* mine(bool create);
  // f(cache) for every cache (registry lock held; call with the device lock held). With prune,
  // caches of exited threads that hold nothing are dropped after it.
  void for_each(const std::function<void(ThreadCache&)>& f, bool prune = false);
  bool empty() const noexcept { return count_.load(std::memory_order_acquire) == 0; }

  FrontBlocks& blocks() noexcept { return blocks_; }
  const FrontBlocks& blocks() const noexcept { return blocks_; }

 private:
  friend struct ThreadCacheExit;
  GiveBack give_back_;
  const uint64_t serial_;  // names this registry in threads' lists (addresses are reused)
  std::mutex mu_;
  std::vector<std::shared_ptr<ThreadCache>> caches_;
  std::atomic<size_t> count_{0};
  FrontBlocks blocks_;
};

}  // namespace expanse::core
