// Blocks carved out of the reservations, and the free-block index used for best-fit placement.
//
// Every byte of every reservation belongs to exactly one block. A free block is either "safe" (all
// work that used it has completed: any stream may take it, its pages may be unmapped) or owned by
// the stream it was freed on until a fence on that stream completes (only that stream may reuse it
// at once; docs/design.md, invariant 3). Free neighbours coalesce when they have the same owner;
// safe blocks always end up coalesced, so a page is reclaimable exactly when it lies wholly inside
// one safe free block.
#pragma once

#include "core/placement/reservation.hpp"
#include "core/placement/spare_nodes.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace expanse::core {

// Which pool a block belongs to, as a small index into the device's pool table (pool_table.hpp);
// 0 is the default pool. Free blocks of different pools never coalesce, and each pool has free
// sets of its own, so a placement only ever sees the memory of the pool it searches.
using PoolSlot = uint16_t;
inline constexpr PoolSlot kDefaultPool = 0;

// A stream as the allocator knows it: the driver's stream id (never reused, unlike handle values),
// or a key the allocator made up (stream_order.hpp). 0 is no stream.
using StreamKey = uint64_t;
inline constexpr StreamKey kNeverFreed = 0;
inline constexpr StreamKey kFreedByMany = ~StreamKey{0};

enum class BlockState : uint8_t {
  free,     // in the free index
  live,     // handed to the user
  pending,  // freed, waiting for other streams that used it (record_stream) to pass the free
  asleep,   // live, but its pool sleeps: its pages were given back (core/sleep_wake.cpp); untouched
};

struct Block {
  size_t size = 0;          // bytes of VA (multiple of kBlockAlignment)
  uint32_t res = 0;         // reservation id
  BlockState state = BlockState::free;
  bool safe = true;         // free: reusable by any stream
  PoolSlot pool = kDefaultPool;  // the pool it belongs to, for life (pool_table.hpp)
  StreamKey stream = 0;     // live: allocation stream; unsafe free/pending: owner
  uint64_t seq = 0;         // unsafe: the owner stream's free sequence number at the free
  // Safe: the stream whose free made this memory free (kNeverFreed: never allocated,
  // kFreedByMany: merged from several streams' frees). Decides what it merges with.
  // Live: the other stream whose freed memory it was placed in (that stream may want it back:
  // the block's free records a fence, stream_watch.cpp), else kNeverFreed.
  StreamKey freed_by = 0;
  size_t requested = 0;     // live: bytes asked for
  std::vector<StreamKey> users;  // live: other streams recorded with record_stream
};

using BlockMap = std::map<CUdeviceptr, Block>;
using BlockIt = BlockMap::iterator;

class BlockIndex {
 public:
  BlockMap& blocks() noexcept { return blocks_; }
  const BlockMap& blocks() const noexcept { return blocks_; }

  // A new reservation: one safe free block covering it.
  void add_reservation(const Reservation& r);
  // Drops the single free block covering r (r must be wholly free).
  void remove_reservation(const Reservation& r);

  // Smallest free block of pool p and arena `a` with size >= bytes that `stream` may use at
  // once: safe blocks and blocks owned by `stream`. Returns end() if none.
  BlockIt best_fit(Arena a, size_t bytes, StreamKey stream, PoolSlot p = kDefaultPool);
  // Like best_fit, but the smallest block for which pred(it) holds, looking at no more than
  // `budget` candidates in size order (the stream's own blocks win ties).
  template <class Pred>
  BlockIt first_fit_where(Arena a, size_t bytes, StreamKey stream, size_t budget, Pred&& pred,
                          PoolSlot p = kDefaultPool) {
    if (p >= pools_.size()) return blocks_.end();
    const int i = static_cast<int>(a);
    FreeSets& f = pools_[p];
    const std::pair<size_t, CUdeviceptr> key{bytes, 0};
    auto s = f.safe[i].lower_bound(key);
    const SizeSet* own = nullptr;
    if (!f.owned[i].empty()) {
      auto o = f.owned[i].find(stream);
      if (o != f.owned[i].end()) own = &o->second;
    }
    SizeSet::const_iterator m = own != nullptr ? own->lower_bound(key) : s;
    for (size_t n = 0; n < budget; ++n) {
      const bool s_ok = s != f.safe[i].end();
      const bool m_ok = own != nullptr && m != own->end();
      if (!s_ok && !m_ok) break;
      const std::pair<size_t, CUdeviceptr>* cand;
      if (m_ok && (!s_ok || m->first <= s->first)) {
        cand = &*m++;
      } else {
        cand = &*s++;
      }
      BlockIt it = blocks_.find(cand->second);
      if (pred(it)) return it;
    }
    return blocks_.end();
  }
  BlockIt end() noexcept { return blocks_.end(); }

  // Takes [start+offset, start+offset+bytes) of a free block out of the index; what lies before
  // and after stays free with the same owner. The returned block is unindexed; the caller sets
  // its state.
  BlockIt carve(BlockIt it, size_t bytes, Arena a, size_t offset = 0);
  // Cuts carved block `it` (not in the index) to `bytes`; the rest becomes a free block after it
  // with the same pool and owner, coalesced with its free neighbour.
  void split_tail(BlockIt it, size_t bytes, Arena a);
  // Puts a block (any state) back in the index as free, coalescing with compatible neighbours.
  BlockIt insert_free(BlockIt it, Arena a);
  // Marks an unsafe free block safe (its owner's fence completed) and coalesces it.
  BlockIt make_safe(BlockIt it, Arena a);
  // Moves a free block to pool p, coalescing it with p's free neighbours.
  BlockIt move_to_pool(BlockIt it, Arena a, PoolSlot p);
  // Makes pool p's free sets exist (before its first block is indexed).
  void add_pool(PoolSlot p);
  // Whether pool p has free blocks.
  bool pool_has_free(PoolSlot p) const noexcept;

  // Unsafe free blocks owned by `stream` in arena `a` (of every pool) with seq <= upto.
  std::vector<BlockIt> owned_up_to(Arena a, StreamKey stream, uint64_t upto);
  std::vector<StreamKey> streams_with_unsafe() const;
  bool any_unsafe() const noexcept;
  // Whether a stream other than `stream` owns an unsafe free block.
  bool any_unsafe_but(StreamKey stream) const noexcept;

  // Safe free blocks of the default pool in arena `a`, largest first (for reclaiming pages under
  // them: only the default pool's free memory gives its pages to others).
  template <class F>
  void for_each_safe_largest_first(Arena a, F&& f) {
    auto& set = pools_[kDefaultPool].safe[static_cast<int>(a)];
    for (auto r = set.rbegin(); r != set.rend(); ++r) {
      if (!f(blocks_.find(r->second))) return;
    }
  }

  // Unsafe free blocks of the default pool in arena `a`, any order; f returns false to stop.
  template <class F>
  void for_each_unsafe(Arena a, F&& f) {
    for (const auto& [owner, set] : pools_[kDefaultPool].owned[static_cast<int>(a)]) {
      for (const auto& e : set) {
        if (!f(blocks_.find(e.second))) return;
      }
    }
  }

  // Room for one more free block in pool p's index: what the next index() of a free (through
  // insert_free or make_safe) would allocate is allocated now, so that freeing a block cannot
  // fail half done for want of host memory. May throw std::bad_alloc; changes nothing else.
  void make_room(PoolSlot p);

  size_t free_blocks() const noexcept;
  // Whether adjacent blocks x and y (in that order, or the other) coalesce when both are free.
  bool mergeable(const Block& x, const Block& y) const noexcept;

 private:
  using SizeSet = std::set<std::pair<size_t, CUdeviceptr>>;
  using OwnerMap = std::unordered_map<StreamKey, SizeSet>;
  void unindex(Arena a, BlockIt it);
  void index(Arena a, BlockIt it);
  // Inserts v into set, in the spare node if there is one.
  void insert_entry(SizeSet& set, const std::pair<size_t, CUdeviceptr>& v);

  // One pool's free blocks: safe ones, and unsafe ones by owner stream, per arena.
  struct FreeSets {
    SizeSet safe[kArenaCount];
    OwnerMap owned[kArenaCount];
  };

  BlockMap blocks_;
  std::vector<FreeSets> pools_ = std::vector<FreeSets>(1);  // by PoolSlot; [0]: the default
  // Inserts a block at key, after hint, in a spare node if there is one.
  BlockIt insert_block(BlockIt hint, CUdeviceptr key, Block&& b);
  // Erases a block, keeping its node.
  void erase_block(BlockIt it);

  // Nodes for the next index() and carve, so that they need not allocate: made by make_room
  // (one entry and one owner at least), and kept from what unindex and merges take out.
  SpareNodes<SizeSet::node_type> spare_entries_;
  SpareNodes<OwnerMap::node_type> spare_owners_;  // their sets are empty
  SpareNodes<BlockMap::node_type> spare_blocks_;
};

}  // namespace expanse::core
