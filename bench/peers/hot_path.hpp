// Workload (a): allocate+free pairs of one size in a loop, each thread on its own stream (a
// warm, cached pair: what a caching allocator's fast path costs).
#pragma once

#include "peers/gpu.hpp"
#include "peers/peer.hpp"

#include <cstddef>

namespace expanse::peers {

// Wall nanoseconds per pair as one thread sees them, `threads` threads at once, best of
// `rounds` runs of `seconds` each. Throws if an allocation fails (nothing here should).
double hot_path_ns_per_pair(Peer& peer, Gpu& gpu, size_t bytes, int threads, double seconds,
                            int rounds);

}  // namespace expanse::peers
