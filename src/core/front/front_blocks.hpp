// The blocks that have passed through a thread cache (thread_cache.hpp), by address, readable
// without the device lock: what a free needs to know to park a block in its thread's cache
// (its stream, size and whether the user holds it) without the allocator's block map.
//
// A block enters when its first eligible free parks it (under the device lock) and leaves when
// it goes back to the allocator's books (a flush, an eviction, a free that takes the locked
// path, record_stream). While it is here it stays live in the allocator's books; `state` says
// whether the user holds it (live) or a thread cache does (cached). Sharded by address, each
// shard with its own lock, so threads freeing different blocks do not wait for each other.
#pragma once

#include "core/placement/block_index.hpp"

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace expanse::core {

class FrontBlocks {
 public:
  enum State : uint8_t { live = 0, cached = 1 };
  struct Entry {
    StreamKey key = 0;       // its allocation stream (also the stream a cached one was freed on)
    size_t size = 0;         // as carved
    size_t requested = 0;    // as asked for
    std::atomic<uint8_t> state{cached};
    // Cached, out of every thread cache: evicted or flushed, but its free into the books could
    // not finish for want of host memory (device lock; DeviceAllocator::settle_owed_locked).
    bool owed = false;
  };
  enum class Claim { unknown, claimed, not_live, other };

  // A free on stream `key` of addr, checking size (0: any): claimed (live -> cached; *out gets
  // the entry), unknown (not here), not_live (cached: a double free), other (another stream,
  // another size: the locked path decides).
  Claim claim(CUdeviceptr addr, StreamKey key, size_t expected_size, Entry** out);
  // A free taking the locked path (device lock held): false if addr is here and cached (a double
  // free); else, when here, marks it cached so that no free racing on another thread claims it
  // too, and true. The caller then parks it (insert_cached) or erases it.
  bool seize(CUdeviceptr addr);
  // Adds addr, cached. Returns its entry (stable until erased).
  Entry* insert_cached(CUdeviceptr addr, StreamKey key, size_t size, size_t requested);
  // nullptr if addr is not here; else its entry (call with the device lock held: entries are
  // erased only under it).
  const Entry* find(CUdeviceptr addr) const;
  // Without the device lock: 1 if addr is here and live (*requested: its size as asked), 0 if
  // here and cached, -1 if not here.
  int user_holds(CUdeviceptr addr, size_t* requested) const;
  // Removes addr if here.
  void erase(CUdeviceptr addr);
  // record_stream (device lock held): removes addr if here and live; false, leaving it, if a
  // thread cache holds it (a free racing on another thread may have parked it since any check).
  bool erase_unless_cached(CUdeviceptr addr);
  // The addresses of the entries marked owed (device lock held). May throw std::bad_alloc.
  std::vector<CUdeviceptr> owed() const;

 private:
  static constexpr size_t kShards = 64;
  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::unordered_map<CUdeviceptr, Entry> map;
  };
  Shard& shard(CUdeviceptr addr) const noexcept {
    // Blocks are 512 B aligned: hash the rest (Fibonacci hashing).
    return shards_[((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 58];
  }
  mutable Shard shards_[kShards];
};

}  // namespace expanse::core
