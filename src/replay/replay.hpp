// Replaying a trace on the allocator, on a fresh sim device with no host memory behind its
// pages (replay never touches the memory), and searching for the smallest device that replays
// a trace with no OOM.
#pragma once

#include "conf/config.hpp"
#include "core/base/device_stats.hpp"
#include "replay/host_model.hpp"
#include "trace/trace.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace expanse::replay {

// One pass over the trace (replay_trace with passes > 1 runs several back to back).
struct PassResult {
  uint64_t ooms = 0;
  uint64_t driver_calls_total = 0;  // made during the pass (and freeing what it left live)
  double modeled_driver_seconds = 0;
  uint64_t peak_physical_bytes = 0;  // peaks during the pass
  uint64_t peak_mapped_bytes = 0;
  uint64_t created_pages = 0;  // physical pages created during the pass
  // Per entry point, made during the pass.
  std::array<uint64_t, driver::kEntryPointCount> driver_calls{};
};

// The first pass's figures at one of ReplayOptions::marks.
struct ReplayMark {
  uint64_t op = 0;                  // after this operation of the trace
  uint64_t driver_calls_total = 0;  // since the replay began
  double modeled_driver_seconds = 0;
  uint64_t physical_bytes = 0;       // now
  uint64_t peak_physical_bytes = 0;  // the most so far
  // Since the replay began, per entry point (core::DeviceStats::driver_calls).
  std::array<uint64_t, driver::kEntryPointCount> driver_calls{};
  uint64_t created_pages = 0;  // since the replay began (core::DeviceStats::num_created_pages)
};

struct ReplayResult {
  HostModel host;        // how the operations were issued (gpu_lag as the sim used it)
  size_t capacity = 0;   // device bytes
  size_t page_size = 0;  // the allocator's page
  uint64_t ops_done = 0;      // over all passes
  uint64_t ooms = 0;          // over all passes
  uint64_t first_oom_op = 0;  // index into trace::Trace::ops
  int first_oom_pass = 0;     // 1-based; 0 when there was none
  std::string first_oom;      // the allocator's message
  core::DeviceStats stats;    // at the end of the replay (peaks and counts over all passes)
  std::vector<PassResult> passes;
  std::vector<uint64_t> mapped_after_op;  // with record_mapped: mapped bytes after each op of
                                          // the first pass
  std::vector<ReplayMark> marks;          // at ReplayOptions::marks, first pass
  double wall_seconds = 0;
};

// The largest device a replay models: the sim reserves its VA in this process's address space
// (47 bits on x86-64), and no GPU comes near it.
constexpr size_t kMaxReplayCapacity = size_t{64} << 40;

// done / total operations of the replay in progress.
using ReplayProgress = std::function<void(uint64_t done, uint64_t total)>;

// The sim device's granularity under conf (sim_granularity), and capacity rounded down to it.
size_t replay_granularity(const conf::Config& conf);

struct ReplayOptions {
  bool stop_at_first_oom = false;  // end the replay at the first OOM
  ReplayProgress progress;
  int passes = 1;             // back to back on the same allocator
  bool record_mapped = false;  // ReplayResult::mapped_after_op
  // Which threads issue the operations, on which stream handle, and how far the sim's GPU runs
  // behind (sim_gpu_lag in the conf, when given, wins over host.gpu_lag).
  HostModel host = default_host_model();
  // Operations (indices into the trace's ops, ascending) after which the first pass's figures
  // are kept (ReplayResult::marks): per-step figures of a workload.
  std::vector<uint64_t> marks;
};

// Replays t on one sim device of `capacity` bytes (a multiple of replay_granularity) with the
// allocator options of conf, o.passes times back to back on the same allocator (so that steady
// state shows): the blocks a pass leaves live are freed before the next one. An OOM is counted
// and its block's free skipped; with stop_at_first_oom the replay ends there. Throws driver /
// usage errors from the allocator, and usage_error for a capacity above kMaxReplayCapacity.
// The trace's inferred empty_cache() calls (trace::Trace::releases) release the allocator's
// cached pages (DeviceAllocator::release_cached) before the operation they precede; its
// free-and-retries release nothing (see replay.cpp).
ReplayResult replay_trace(const trace::Trace& t, const conf::Config& conf, size_t capacity,
                          const ReplayOptions& o = {});

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
// device replays on any larger one. Throws trace::input_error if even 64 x start is not enough.
MinCapacity find_min_capacity(const trace::Trace& t, const conf::Config& conf, size_t start,
                              const SearchProgress& progress = {},
                              const HostModel& host = default_host_model());

}  // namespace expanse::replay
