#include "peers/hot_path.hpp"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace expanse::peers {
namespace {

using Clock = std::chrono::steady_clock;

double pairs_per_second(Peer& peer, Gpu& gpu, size_t bytes, int threads, double seconds) {
  const std::vector<Stream> streams = gpu.streams(static_cast<size_t>(threads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false}, failed{false};
  std::vector<uint64_t> pairs(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const Stream s = streams[static_cast<size_t>(t)];
      uint64_t k = 0;
      try {
        gpu.bind_thread();
        for (int w = 0; w < 2; ++w) {  // warm: memory obtained, block cached
          void* p = peer.allocate(bytes, s);
          if (p == nullptr) throw std::runtime_error("out of memory");
          peer.deallocate(p, bytes, s);
        }
      } catch (...) {
        failed.store(true);
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      try {
        while (!failed.load(std::memory_order_relaxed) &&
               !stop.load(std::memory_order_relaxed)) {
          for (int i = 0; i < 256; ++i) {
            void* p = peer.allocate(bytes, s);
            if (p == nullptr) throw std::runtime_error("out of memory");
            peer.deallocate(p, bytes, s);
          }
          k += 256;
        }
      } catch (...) {
        failed.store(true);
      }
      pairs[static_cast<size_t>(t)] = k;
    });
  }
  while (ready.load() != threads) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  if (failed.load()) {
    throw std::runtime_error("hot path: an allocate or free of " + std::to_string(bytes) +
                             " bytes failed");
  }
  uint64_t total = 0;
  for (uint64_t k : pairs) total += k;
  return static_cast<double>(total) / elapsed;
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
