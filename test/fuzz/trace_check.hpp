// What every Trace a reader returns must satisfy, whatever the input: what the replayer relies
// on (block ids and stream indexes in range, each block allocated once before it is freed, at
// most one free) and the figures it reports. Shared by the fuzz targets (which abort on a
// violation, for libFuzzer to report) and the unit test that replays the regression inputs.
#pragma once

#include "trace/trace.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace expanse::fuzz {

// "" when t is consistent, else what is wrong.
inline std::string trace_problem(const trace::Trace& t) {
  if (t.streams.empty()) return "no streams";
  std::vector<uint8_t> state(t.blocks, 0);  // 0 never allocated, 1 live, 2 freed
  std::vector<uint64_t> size(t.blocks, 0);
  uint64_t live = 0, peak = 0, allocs = 0;
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const trace::TraceOp& op = t.ops[i];
    const std::string at = "op " + std::to_string(i) + ": ";
    if (op.block >= t.blocks) return at + "block id out of range";
    if (op.stream >= t.streams.size()) return at + "stream index out of range";
    if (op.type == trace::TraceOp::Type::alloc) {
      if (state[op.block] != 0) return at + "block allocated twice";
      state[op.block] = 1;
      size[op.block] = op.size;
      if (op.size > UINT64_MAX - live) return at + "live bytes past 2^64";
      live += op.size;
      peak = std::max(peak, live);
      ++allocs;
    } else {
      if (state[op.block] != 1) return at + "free of a block that is not live";
      state[op.block] = 2;
      live -= size[op.block];
    }
  }
  for (size_t i = 0; i < t.releases.size(); ++i) {
    if (t.releases[i].op > t.ops.size()) return "release " + std::to_string(i) + " after the end";
    if (i > 0 && t.releases[i].op < t.releases[i - 1].op) return "releases out of order";
  }
  if (t.torch && t.torch->block_addr.size() != t.blocks) return "block_addr does not cover blocks";
  if (peak != t.peak_live_bytes) return "peak_live_bytes differs from the ops'";
  if (live != t.live_at_end_bytes) return "live_at_end_bytes differs from the ops'";
  if (allocs != t.allocs + t.preexisting) return "allocs + preexisting differs from the ops'";
  return "";
}

}  // namespace expanse::fuzz
