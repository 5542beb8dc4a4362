// The pools of one device: private reuse domains (docs/design.md, "Pools").
//
// A block belongs to one pool for life (Block::pool); only allocations made into a pool reuse its
// free memory, and while its use count is above 0 its pages stay mapped where they are (a CUDA
// graph captured into it addresses them on every replay) and no other pool takes them. At use
// count 0 the pool is released: once a synchronize of the device's context proves the work that
// used it done (never while a capture is announced), its free memory becomes the default pool's
// (returned), and the pool is forgotten when its last live block is freed.
//
// Pools are named by the caller's 64-bit ids (0 is never a pool) and indexed here by small slots
// that the block index uses; a slot is reused once its pool is forgotten, an id never is.
#pragma once

#include "core/base/device_stats.hpp"
#include "core/placement/block_index.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace expanse::core {

using PoolId = uint64_t;

// "pool ID on device D", as messages name a pool.
std::string pool_name(PoolId id, int device);

struct PoolState {
  PoolId id = 0;
  int use_count = 0;
  bool returned = false;  // released and proven done: its free memory is the default pool's
  // Its blocks are registrable blocks (registrable_blocks.hpp), outside the page books.
  bool registrable = false;
  size_t live_blocks = 0;
  // Its live registrable blocks (outside the page books and live_blocks): the pool is forgotten
  // only once they are freed too.
  size_t registrable_blocks = 0;
  size_t requested_bytes = 0;  // live, as asked for
  size_t allocated_bytes = 0;  // live, as carved
  // Sleep (core/sleep_wake.cpp): its pages given back, its addresses and blocks kept.
  bool asleep = false;
  bool offloaded = false;     // asleep with its live blocks' bytes in `backup`
  bool zero_on_wake = false;  // asleep with its content dropped, to be zeroed at wake
  void* backup = nullptr;  // pinned host staging, kept across cycles
  size_t backup_bytes = 0;
  std::vector<std::pair<CUdeviceptr, size_t>> saved;  // asleep live block -> offset in backup
  SleepCycles cycles;
  bool in_use() const noexcept { return id != 0; }
};

class PoolTable {
 public:
  // Makes pool `id` with use count 1. Throws expanse::usage_error for id 0, an id used before
  // (on this device), or when 65535 pools are in use.
  PoolSlot create(PoolId id, int device);
  // The slot of pool `id`. Throws expanse::usage_error naming `what`, the id and the device for
  // an id never created here, and (need_live) for a pool whose use count reached 0.
  PoolSlot find(PoolId id, const char* what, int device, bool need_live) const;
  // Whether pool `id` is in the table (created here, not yet forgotten).
  bool contains(PoolId id) const noexcept { return by_id_.count(id) != 0; }
  // The slot of pool `id` if it exists and its use count is above 0, else kDefaultPool.
  PoolSlot live_slot(PoolId id) const noexcept {
    auto it = by_id_.find(id);
    return it != by_id_.end() && slots_[it->second].use_count > 0 ? it->second : kDefaultPool;
  }
  // The slot of pool `id` while it is in the table (whatever its use count), else kDefaultPool.
  PoolSlot slot_of(PoolId id) const noexcept {
    auto it = by_id_.find(id);
    return it != by_id_.end() ? it->second : kDefaultPool;
  }
  PoolState& at(PoolSlot s) noexcept { return slots_[s]; }
  const PoolState& at(PoolSlot s) const noexcept { return slots_[s]; }
  // Forgets the pool in slot s (returned, no live block): its slot may serve another pool. Out
  // of host memory it throws std::bad_alloc having changed nothing; after make_room_to_forget it
  // cannot fail.
  void forget(PoolSlot s);
  // Allocates now what the next forget() would: a caller makes room before the first step it
  // cannot undo. May throw std::bad_alloc; changes nothing else.
  void make_room_to_forget();
  // Pools released and not yet returned.
  std::vector<PoolSlot> awaiting_return() const;
  // f(slot, state) for every pool in the table.
  template <class F>
  void for_each(F&& f) const {
    for (size_t s = 1; s < slots_.size(); ++s) {
      if (slots_[s].in_use()) f(static_cast<PoolSlot>(s), slots_[s]);
    }
  }
  bool empty() const noexcept { return by_id_.empty(); }
  // Whether create() would find no slot.
  bool full() const noexcept {
    return free_slots_.empty() && slots_.size() > std::numeric_limits<PoolSlot>::max();
  }

 private:
  std::vector<PoolState> slots_ = std::vector<PoolState>(1);  // [0]: the default pool
  std::vector<PoolSlot> free_slots_;
  std::unordered_map<PoolId, PoolSlot> by_id_;
  std::unordered_set<PoolId> forgotten_;  // ids released and forgotten: errors say so
  std::unordered_set<PoolId>::node_type spare_forgotten_;  // for the next forget()
};

}  // namespace expanse::core
