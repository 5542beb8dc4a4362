// Workload (b): a recorded PyTorch trace executed on the GPU: its allocations and frees in the
// recorded order, each on a stream of its own recorded stream, every allocated block's pages
// written once on that stream (Gpu::touch), the empty_cache() calls inferred from the recording
// made through the allocator's own release.
#pragma once

#include "peers/gpu.hpp"
#include "peers/peer.hpp"
#include "trace/trace.hpp"

#include <cstdint>
#include <vector>

namespace expanse::peers {

struct TraceRunResult {
  std::vector<double> pass_seconds;  // wall time of each pass, the GPU synchronized at its end
  uint64_t peak_reserved = 0;        // the allocator's own figure, over all passes
  uint64_t ooms = 0;                 // allocations the allocator refused (their frees skipped)
  uint64_t empty_cache_calls = 0;    // per pass
};

TraceRunResult run_trace(Peer& peer, Gpu& gpu, const trace::Trace& t, int passes);

}  // namespace expanse::peers
