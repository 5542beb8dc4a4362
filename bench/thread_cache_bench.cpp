// Allocate+free pairs per second with thread caches (core/front/thread_cache.hpp) next to the same
// allocator without them (thread_cache 0: every pair takes the device lock), from one run: 1, 2
// and 8 threads, each on its own stream, allocating and freeing one size in a loop (a warm,
// cached pair: no driver call). Prints ns per pair and the 2-thread/1-thread scaling.
//
//   build/bin/expanse_bench_thread_cache [seconds per figure, default 0.5] [rounds, default 5]
//   EXPANSE_BENCH_CONF=driver:cuda build/bin/expanse_bench_thread_cache   (a real GPU's driver)
//
// Each figure is the best of `rounds` runs (the machine is shared; the best run is the one
// least disturbed).
#include "bench_driver.hpp"
#include "timed_pairs.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Device {
  std::unique_ptr<expanse::driver::LoadedDriver> drv;
  CUcontext ctx = nullptr;
  std::vector<CUstream> streams;

  Device() {
    drv = expanse::bench::open_bench_driver(size_t{80} << 30, false, "benchmark");
    const auto& t = drv->table();
    using expanse::driver::EntryPoint;
    CUdevice dev = 0;
    drv->check(t.device_get(&dev, 0), EntryPoint::device_get);
    drv->check(t.device_primary_ctx_retain(&ctx, dev), EntryPoint::device_primary_ctx_retain);
    for (int i = 0; i < 8; ++i) {
      drv->check(t.ctx_set_current(ctx), EntryPoint::ctx_set_current);
      CUstream s = nullptr;
      drv->check(t.stream_create(&s, CU_STREAM_NON_BLOCKING), EntryPoint::stream_create);
      streams.push_back(s);
    }
  }
};

// Pairs per second of `threads` threads, each on its own stream, over `seconds`.
double pairs_per_second(Device& d, expanse::core::DeviceAllocator& a, int threads, size_t n,
                        double seconds) {
  auto warm = [&](int t) {
    d.drv->table().ctx_set_current(d.ctx);
    CUstream s = d.streams[static_cast<size_t>(t)];
    a.deallocate(a.allocate(n, s), s);  // pages mapped (and the block cached, if on)
    a.deallocate(a.allocate(n, s), s);
  };
  auto batch = [&](int t) {
    CUstream s = d.streams[static_cast<size_t>(t)];
    for (uint64_t i = 0; i < expanse::bench::kPairsPerBatch; ++i) {
      void* p = a.allocate(n, s);
      a.deallocate(p, s);
    }
  };
  return expanse::bench::pairs_per_second(threads, seconds, warm, batch);
}

double best_of(Device& d, expanse::core::DeviceAllocator& a, int threads, size_t n,
               double seconds, int rounds) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const double v = pairs_per_second(d, a, threads, n, seconds);
    if (v > best) best = v;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  Device d;
  std::printf("driver: %s; %u hardware threads; best of %d runs of %.2f s each\n",
              d.drv->description().c_str(), std::thread::hardware_concurrency(), rounds, seconds);
  expanse::core::AllocatorOptions off;  // thread_cache 0: the locked path, as before
  expanse::core::AllocatorOptions on;
  on.thread_cache_bytes = expanse::conf::kDefaultThreadCacheBytes;
  on.thread_cache_entries = expanse::conf::kDefaultThreadCacheEntries;
  expanse::core::DeviceAllocator a_off(*d.drv, 0, off);
  expanse::core::DeviceAllocator a_on(*d.drv, 0, on);

  std::printf("\nallocate+free pair, each thread on its own stream\n");
  std::printf("%10s %8s | %14s %10s | %14s %10s | %8s\n", "size", "threads", "off pairs/s",
              "off ns", "on pairs/s", "on ns", "on/off");
  for (size_t n : {size_t{4096}, size_t{1} << 20}) {
    double one_off = 0, one_on = 0, two_off = 0, two_on = 0;
    for (int threads : {1, 2, 8}) {
      const double po = best_of(d, a_off, threads, n, seconds, rounds);
      const double pn = best_of(d, a_on, threads, n, seconds, rounds);
      // ns per pair as one thread sees it: its wall time per pair.
      std::printf("%10zu %8d | %14.0f %10.1f | %14.0f %10.1f | %8.2f\n", n, threads, po,
                  1e9 * threads / po, pn, 1e9 * threads / pn, pn / po);
      if (threads == 1) {
        one_off = po;
        one_on = pn;
      } else if (threads == 2) {
        two_off = po;
        two_on = pn;
      }
    }
    std::printf("%10zu scaling 2 threads / 1 thread: off %.2fx, on %.2fx (goal >= 1.70x); "
                "1-thread pair: off %.1f ns, on %.1f ns (goal <= 150 ns)\n",
                n, two_off / one_off, two_on / one_on, 1e9 / one_off, 1e9 / one_on);
  }
  const auto s_on = a_on.stats();
  std::printf("\ncache on: %llu allocations (%llu from thread caches), %llu frees, live blocks "
              "%llu, driver calls %llu\n",
              static_cast<unsigned long long>(s_on.num_allocs),
              static_cast<unsigned long long>(s_on.thread_cache_hits),
              static_cast<unsigned long long>(s_on.num_frees),
              static_cast<unsigned long long>(s_on.live_blocks),
              static_cast<unsigned long long>(s_on.total_driver_calls()));
  return 0;
}
