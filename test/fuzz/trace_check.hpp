// What every Trace a reader returns must satisfy, whatever the input: what the replayer relies
// on (block ids and stream indexes in range, each block allocated once before it is freed, at
// most one free) and the counts it reports. A violation aborts, which libFuzzer reports.
#pragma once

#include "replay/trace.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace expanse::fuzz {

inline void check(const replay::Trace& t) {
  if (t.streams.empty()) std::abort();
  std::vector<uint8_t> state(t.blocks, 0);  // 0 never allocated, 1 live, 2 freed
  uint64_t live = 0, peak = 0, allocs = 0;
  std::vector<uint64_t> size(t.blocks, 0);
  for (const replay::TraceOp& op : t.ops) {
    if (op.block >= t.blocks || op.stream >= t.streams.size()) std::abort();
    if (op.type == replay::TraceOp::Type::alloc) {
      if (state[op.block] != 0) std::abort();
      state[op.block] = 1;
      size[op.block] = op.size;
      live += op.size;
      peak = std::max(peak, live);
      ++allocs;
    } else {
      if (state[op.block] != 1) std::abort();
      state[op.block] = 2;
      live -= size[op.block];
    }
  }
  if (peak != t.peak_live_bytes || live != t.live_at_end_bytes) std::abort();
  if (allocs != t.allocs + t.preexisting) std::abort();
}

}  // namespace expanse::fuzz
