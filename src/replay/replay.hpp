// Replaying a trace on the allocator, on a fresh sim device with no host memory behind its
// pages (replay never touches the memory), and searching for the smallest device that replays
// a trace with no OOM.
#pragma once

#include "api/config.hpp"
#include "core/stats.hpp"
#include "replay/trace.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace expanse::replay {

struct ReplayResult {
  size_t capacity = 0;   // device bytes
  size_t page_size = 0;  // the allocator's page
  uint64_t ops_done = 0;
  uint64_t ooms = 0;
  uint64_t first_oom_op = 0;  // index into Trace::ops
  std::string first_oom;      // the allocator's message
  core::DeviceStats stats;    // at the end of the replay (peaks over the replay)
  std::vector<uint64_t> mapped_after_op;  // with record_mapped: mapped bytes after each op
  double wall_seconds = 0;
};

// done / total operations of the replay in progress.
using ReplayProgress = std::function<void(uint64_t done, uint64_t total)>;

// The sim device's granularity under conf (sim_granularity), and capacity rounded down to it.
size_t replay_granularity(const api::Config& conf);

// Replays t on one sim device of `capacity` bytes (a multiple of replay_granularity) with the
// allocator options of conf. An OOM is counted and its block's free skipped; with
// stop_at_first_oom the replay ends there. Throws driver / usage errors from the allocator.
ReplayResult replay_trace(const Trace& t, const api::Config& conf, size_t capacity,
                          bool stop_at_first_oom = false,
                          const ReplayProgress& progress = {}, bool record_mapped = false);

struct MinCapacity {
  size_t bytes = 0;  // the smallest capacity found that replays with no OOM
  int probes = 0;    // replays run by the search
  double wall_seconds = 0;
  ReplayResult at_min;  // the replay at that capacity
};

// probe: 1-based index of the replay running, expected: the number the search expects in all.
using SearchProgress =
    std::function<void(int probe, int expected, uint64_t done, uint64_t total)>;

// Binary search, in units of the granularity, between ceil(peak live) (anything smaller cannot
// hold the trace) and a capacity that replays with no OOM (start, doubled until one does, up to
// 64 x start). Each probe is a fresh sim and allocator. Assumes that a trace that replays on a
// device replays on any larger one. Throws input_error if even 64 x start is not enough.
MinCapacity find_min_capacity(const Trace& t, const api::Config& conf, size_t start,
                              const SearchProgress& progress = {});

}  // namespace expanse::replay
