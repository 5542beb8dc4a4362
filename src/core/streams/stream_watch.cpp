// Proving frees that another stream wants (docs/design.md, "Settling on a repeated workload").
// Fences can be recorded only on handles that cannot name a destroyed stream (the current
// call's: stream_fences.cpp), so a stream proves its frees from its own calls or not at all. A
// fence at every free would cost every stream a cuEventRecord per free; only frees whose memory
// another stream wants need one: frees of blocks other streams used or had freed before (they
// may want them back), and frees in or beside ranges another stream wanted while they were
// unproven (wanted_ranges.hpp).
#include "core/base/check.hpp"
#include "core/streams/stream_order.hpp"

#include <algorithm>

namespace expanse::core {

void StreamOrder::record_owed(StreamState& ss) {
  DeviceDriver::RelaxedCapture relaxed(drv_);
  if (record_fence(ss) == Recorded::yes) ss.owes_fence = false;
}

bool StreamOrder::query_fences(StreamState& ss) {
  bool advanced = false;
  while (!ss.fences.empty()) {
    // Not ready, or an error: not proven.
    if (drv_.event_query(ss.fences.front().event) != CUDA_SUCCESS) break;
    retire_oldest_fence(ss);
    advanced = true;
  }
  EXPANSE_ASSERT(ss.safe_seq <= ss.free_seq);
  return advanced;
}

bool StreamOrder::prove_for(CUdeviceptr at, size_t size, StreamKey for_key,
                            std::vector<StreamKey>* not_proven) {
  BlockMap& blocks = placement_.index().blocks();
  auto it = blocks.upper_bound(at);
  if (it == blocks.begin()) return false;
  --it;
  std::vector<StreamKey> keys;  // the streams whose proofs stand in the way
  auto add = [&](StreamKey k) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  };
  const uint32_t res = it->second.res;
  const PoolSlot pool = it->second.pool;
  bool own = false;  // for_key's own unproven free memory lies in the range
  size_t parts = 0;
  for (; it != blocks.end() && it->first < at + size; ++it) {
    const Block& b = it->second;
    if (it->first + b.size <= at) continue;
    if (b.res != res || b.pool != pool) return false;  // never one block
    ++parts;
    if (b.state == BlockState::free) {
      if (b.safe) continue;
      if (b.stream == for_key) {
        own = true;
      } else {
        add(b.stream);
      }
    } else if (b.state == BlockState::pending) {
      add(b.stream);  // its freeing stream owns it once released
      for (const Pending& p : pending_) {
        if (p.it != it) continue;
        for (const auto& dep : p.deps) add(dep.first);
        break;
      }
    } else {
      return false;  // in use: no proof helps
    }
  }
  // for_key's own free memory is usable by it as it is; it matters only where it does not merge
  // with other streams' memory made safe beside it until proven (block_index.cpp, mergeable).
  // Within one stream everything free merges: a single-stream workload never gets here.
  if (own && parts > 1) add(for_key);
  if (keys.empty()) return false;
  wanted_.want(at, at + size, use_clock_);
  DeviceDriver::RelaxedCapture relaxed(drv_);
  bool advanced = false;
  for (StreamKey k : keys) {
    StreamState* st = find_state(k);
    if (st == nullptr) continue;
    if (std::find(not_proven->begin(), not_proven->end(), k) != not_proven->end()) continue;
    if (k == for_key) {  // the call's stream: its fence can be recorded now
      st->owes_fence = true;
      fence_if_owed(*st);
    }
    if (st->safe_seq < st->free_seq && query_fences(*st)) advanced = true;
    if (st->safe_seq < st->free_seq) not_proven->push_back(k);
  }
  if (!advanced) return false;
  for (StreamKey k : keys) {
    if (StreamState* st = find_state(k); st != nullptr && st->safe_seq > 0) settle(*st);
  }
  release_pending();
  return true;
}

}  // namespace expanse::core
