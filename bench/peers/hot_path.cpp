#include "peers/hot_path.hpp"

#include "timed_pairs.hpp"

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace expanse::peers {
namespace {

double pairs_per_second(Peer& peer, Gpu& gpu, size_t bytes, int threads, double seconds) {
  const std::vector<Stream> streams = gpu.streams(static_cast<size_t>(threads));
  auto pair = [&](Stream s) {
    void* p = peer.allocate(bytes, s);
    if (p == nullptr) throw std::runtime_error("out of memory");
    peer.deallocate(p, bytes, s);
  };
  auto warm = [&](int t) {
    gpu.bind_thread();
    for (int w = 0; w < 2; ++w) pair(streams[static_cast<size_t>(t)]);  // memory obtained, cached
  };
  auto batch = [&](int t) {
    for (uint64_t i = 0; i < bench::kPairsPerBatch; ++i) pair(streams[static_cast<size_t>(t)]);
  };
  try {
    return bench::pairs_per_second(threads, seconds, warm, batch);
  } catch (const std::exception& e) {
    throw std::runtime_error("hot path: an allocate or free of " + std::to_string(bytes) +
                             " bytes failed: " + e.what());
  }
}

}  // namespace

double hot_path_ns_per_pair(Peer& peer, Gpu& gpu, size_t bytes, int threads, double seconds,
                            int rounds) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const double v = pairs_per_second(peer, gpu, bytes, threads, seconds);
    if (v > best) best = v;
  }
  gpu.synchronize();
  return 1e9 * threads / best;
}

}  // namespace expanse::peers
