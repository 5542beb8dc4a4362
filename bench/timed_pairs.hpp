// Pairs per second of several threads at once: the harness the hot-path benchmarks share. Each
// thread warms up (its stream's first pairs: memory obtained, block cached), all start together,
// run batches of pairs until the time is up, and the pairs of all threads are summed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace expanse::bench {

// Pairs per second of `threads` threads over `seconds`: thread t runs warm(t) once, then
// batch(t) (which makes kPairsPerBatch allocate+free pairs) until stopped. The first exception a
// thread throws stops every thread and is rethrown here.
constexpr uint64_t kPairsPerBatch = 256;

template <class Warm, class Batch>
double pairs_per_second(int threads, double seconds, Warm warm, Batch batch) {
  using Clock = std::chrono::steady_clock;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::mutex error_mu;
  std::exception_ptr error;
  auto fail = [&] {
    std::lock_guard<std::mutex> lock(error_mu);
    if (!error) error = std::current_exception();
    stop.store(true);
  };
  std::vector<uint64_t> pairs(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        warm(t);
      } catch (...) {
        fail();
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      uint64_t k = 0;
      try {
        while (!stop.load(std::memory_order_relaxed)) {
          batch(t);
          k += kPairsPerBatch;
        }
      } catch (...) {
        fail();
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
  if (error) std::rethrow_exception(error);
  uint64_t total = 0;
  for (uint64_t k : pairs) total += k;
  return static_cast<double>(total) / elapsed;
}

}  // namespace expanse::bench
