#include "core/front/thread_cache.hpp"

#include <algorithm>
#include <new>

namespace expanse::core {
namespace {

// Never destroyed: thread exits during process exit take it.
std::mutex& lifetime_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}

std::atomic<uint64_t> g_next_serial{1};

// The calling thread's last answer of ThreadCaches::mine (trivially destructible: readable at
// any point of the thread's exit).
thread_local uint64_t t_last_serial = 0;
thread_local ThreadCache* t_last = nullptr;
thread_local bool t_exited = false;

}  // namespace

// ---- one cache ----------------------------------------------------------------------------------

bool ThreadCache::take(StreamKey key, size_t requested, CachedBlock* out) {
  for (Bin& b : bins_) {
    if (b.key != key || b.requested != requested || b.blocks.empty()) continue;
    *out = b.blocks.back();
    b.blocks.pop_back();
    bytes_ -= out->size;
    requested_ -= out->requested;
    --entries_;
    return true;
  }
  return false;
}

void ThreadCache::put(StreamKey key, const CachedBlock& blk, size_t max_bytes,
                      size_t max_entries, std::vector<CachedBlock>* evicted) {
  Bin* bin = nullptr;
  Bin* empty = nullptr;
  for (Bin& b : bins_) {
    if (b.key == key && b.requested == blk.requested) {
      bin = &b;
      break;
    }
    if (empty == nullptr && b.blocks.empty()) empty = &b;
  }
  if (bin == nullptr) {
    if (empty == nullptr) {
      bins_.emplace_back();
      empty = &bins_.back();
    }
    bin = empty;  // an empty bin of another size is reused (bins stay at most max_entries + 1)
    bin->key = key;
    bin->requested = blk.requested;
  }
  // Whatever can throw, before anything changes: nothing below allocates.
  bin->blocks.reserve(bin->blocks.size() + 1);
  if (entries_ + 1 > max_entries || bytes_ + blk.size > max_bytes) {
    evicted->reserve(evicted->size() + entries_ + 1);
  }
  bin->blocks.push_back(blk);
  bin->blocks.back().stamp = ++clock_;
  bytes_ += blk.size;
  requested_ += blk.requested;
  ++entries_;
  while (entries_ > max_entries || bytes_ > max_bytes) {
    Bin* oldest = nullptr;
    for (Bin& b : bins_) {
      if (!b.blocks.empty() && (oldest == nullptr || b.blocks.front().stamp <
                                                         oldest->blocks.front().stamp)) {
        oldest = &b;
      }
    }
    const CachedBlock out = oldest->blocks.front();
    oldest->blocks.erase(oldest->blocks.begin());
    bytes_ -= out.size;
    requested_ -= out.requested;
    --entries_;
    evicted->push_back(out);
  }
}

std::vector<CachedBlock> ThreadCache::take_all() {
  std::vector<CachedBlock> out;
  out.reserve(entries_);
  for (Bin& b : bins_) {
    out.insert(out.end(), b.blocks.begin(), b.blocks.end());
    b.blocks.clear();
  }
  bins_.clear();
  bytes_ = requested_ = entries_ = 0;
  return out;
}


// ---- the thread's caches --------------------------------------------------------------------------

// The calling thread's caches; its destructor (thread exit) gives their blocks back.
struct ThreadCacheExit {
  struct Ref {
    uint64_t serial;
    std::shared_ptr<ThreadCache> cache;
  };
  std::vector<Ref> refs;

  ~ThreadCacheExit() {
    t_exited = true;
    t_last_serial = 0;
    t_last = nullptr;
    // Held across give_back: the allocator cannot be destroyed meanwhile (~ThreadCaches).
    std::lock_guard<std::mutex> life(lifetime_mu());
    for (Ref& r : refs) {
      ThreadCache& c = *r.cache;
      std::vector<CachedBlock> blocks;
      ThreadCaches* owner = nullptr;
      c.lock.lock();
      owner = c.owner;
      c.thread_gone = true;
      if (owner != nullptr) {
        try {
          blocks = c.take_all();
        } catch (const std::bad_alloc&) {
          owner = nullptr;  // out of host memory: they stay here; the next flush frees them
        }
      }
      c.lock.unlock();
      if (owner == nullptr) continue;
      try {
        owner->give_back_(blocks, c);
      } catch (...) {
        // At process exit the driver may be gone; the blocks stay live in the books.
      }
    }
  }
};

namespace {
thread_local ThreadCacheExit t_caches;
}  // namespace

ThreadCaches::ThreadCaches(GiveBack give_back)
    : give_back_(std::move(give_back)),
      serial_(g_next_serial.fetch_add(1, std::memory_order_relaxed)) {
  // Made here, not first at a thread's exit, where running out of host memory would terminate.
  (void)lifetime_mu();
}

ThreadCaches::~ThreadCaches() { detach_all(); }

void ThreadCaches::detach_all() {
  std::lock_guard<std::mutex> life(lifetime_mu());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : caches_) {
    c->lock.lock();
    c->owner = nullptr;
    (void)c->take_all();
    c->lock.unlock();
  }
  caches_.clear();
  count_.store(0, std::memory_order_release);
}

ThreadCache* ThreadCaches::mine(bool create) {
  if (t_last_serial == serial_) return t_last;
  if (t_exited) return nullptr;
  ThreadCacheExit& list = t_caches;
  for (const auto& r : list.refs) {
    if (r.serial == serial_) {
      t_last_serial = serial_;
      t_last = r.cache.get();
      return t_last;
    }
  }
  if (!create) return nullptr;
  // Caches of allocators since destroyed are of no use any more.
  list.refs.erase(std::remove_if(list.refs.begin(), list.refs.end(),
                                 [](const ThreadCacheExit::Ref& r) {
                                   r.cache->lock.lock();
                                   const bool gone = r.cache->owner == nullptr;
                                   r.cache->lock.unlock();
                                   return gone;
                                 }),
                  list.refs.end());
  auto c = std::make_shared<ThreadCache>();
  c->owner = this;
  {
    std::lock_guard<std::mutex> lock(mu_);
    caches_.push_back(c);
    count_.store(caches_.size(), std::memory_order_release);
  }
  list.refs.push_back({serial_, c});
  t_last_serial = serial_;
  t_last = c.get();
  return t_last;
}

void ThreadCaches::for_each(const std::function<void(ThreadCache&)>& f, bool prune) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : caches_) f(*c);
  if (!prune) return;
  caches_.erase(std::remove_if(caches_.begin(), caches_.end(),
                               [](const std::shared_ptr<ThreadCache>& c) {
                                 c->lock.lock();
                                 const bool gone = c->thread_gone && c->entries() == 0 &&
                                                   c->hits == 0 && c->queries == 0;
                                 c->lock.unlock();
                                 return gone;
                               }),
                caches_.end());
  count_.store(caches_.size(), std::memory_order_release);
}

}  // namespace expanse::core
