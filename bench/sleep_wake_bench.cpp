// Sleep and wake of a weights-like pool: modeled driver time (the H100 cost table: copies at the
// table's host-copy bandwidth, VMM calls at their measured costs) and bandwidth, next to what the
// same cost table gives a per-allocation strategy (what torch_memory_saver and vLLM's CuMemAllocator
// do: one physical handle per allocation, one copy per allocation, each synchronous), from the same
// run. The sim moves the bytes for real (pages backed by host memory), so the sizes measured here
// are the ones this machine's RAM holds; larger sizes are extrapolated per byte from the measured
// ones and printed as such.
//
//   build/bin/expanse_bench_sleep_wake            (1 and 2 GiB measured; 8 and 40 GiB extrapolated)
//   build/bin/expanse_bench_sleep_wake 1 2        (sizes in GiB to measure)
//   EXPANSE_BENCH_CONF=driver:cuda build/bin/expanse_bench_sleep_wake 1 8 40
//       (a real GPU: the timed columns are the figures; nothing is extrapolated)
#include "bench_driver.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "driver_api/cost_model.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

using expanse::driver::EntryPoint;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

// A model's weights: per layer two large matrices and a few small vectors.
std::vector<size_t> weight_blocks(size_t total) {
  std::vector<size_t> out;
  size_t left = total;
  for (size_t layer = 0; left > 0; ++layer) {
    for (size_t n : {48 * MiB, 16 * MiB, size_t{64} << 10, size_t{4096}, size_t{4096}}) {
      const size_t take = n < left ? n : left;
      out.push_back(take);
      left -= take;
      if (left == 0) break;
    }
  }
  return out;
}

// The per-allocation strategy under the same cost table: sleep = per block a copy to pinned host
// memory, a stream synchronize, an unmap and a release; wake = per block a create, a map, an
// access grant, a copy back and a synchronize.
void per_allocation_ns(const std::vector<size_t>& blocks, double* sleep_ns, double* wake_ns) {
  const auto& m = expanse::driver::CostModel::get_default();
  *sleep_ns = *wake_ns = 0;
  for (size_t n : blocks) {
    const size_t h = (n + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);  // granularity-rounded handle
    *sleep_ns += m.cost_ns(EntryPoint::memcpy_dtoh_async, n) +
                 m.cost_ns(EntryPoint::stream_synchronize) + m.cost_ns(EntryPoint::mem_unmap, h) +
                 m.cost_ns(EntryPoint::mem_release, h);
    *wake_ns += m.cost_ns(EntryPoint::mem_create, h) + m.cost_ns(EntryPoint::mem_map, h) +
                m.cost_ns(EntryPoint::mem_set_access, h) +
                m.cost_ns(EntryPoint::memcpy_htod_async, n) +
                m.cost_ns(EntryPoint::stream_synchronize);
  }
}

struct Result {
  size_t bytes;
  double sleep_ns, wake_ns;         // expanse, modeled
  double base_sleep_ns, base_wake_ns;  // per-allocation strategy, modeled
  double sleep_s, wake_s;           // timed: a GPU's figures on the real driver; on the sim, the
                                    // sim's own time (not a GPU figure)
};

// The real driver when EXPANSE_BENCH_CONF names one (driver:cuda), else a sim device with room
// for the pool and the rest of the run.
std::unique_ptr<expanse::driver::LoadedDriver> open_driver(size_t total) {
  return expanse::bench::open_bench_driver(total + total / 2 + GiB, true, "sleep-wake-bench");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result measure(size_t total) {
  auto drv = open_driver(total);
  expanse::core::DeviceAllocator alloc(*drv, 0, expanse::core::AllocatorOptions{});
  alloc.create_pool(1);
  const std::vector<size_t> blocks = weight_blocks(total);
  std::vector<void*> ptrs;
  for (size_t n : blocks) ptrs.push_back(alloc.allocate(n, nullptr, 1));
  // A first cycle makes the pinned staging (kept across cycles) and maps the live blocks with
  // large handles at wake (a pool maps its memory one page per handle when it allocates): time
  // the second, the steady state of an engine put to sleep again and again. The first is printed
  // too.
  double first_ns = alloc.stats().modeled_driver_ns;
  alloc.sleep_pool(1, expanse::core::DeviceAllocator::SleepMode::offload);
  alloc.wake_pool(1);
  first_ns = alloc.stats().modeled_driver_ns - first_ns;
  std::printf("          first cycle after loading %.0f GiB: %.3f s modeled (sleep + wake)\n",
              double(total) / GiB, first_ns * 1e-9);
  Result r{};
  r.bytes = total;
  auto t0 = std::chrono::steady_clock::now();
  double before = alloc.stats().modeled_driver_ns;
  alloc.sleep_pool(1, expanse::core::DeviceAllocator::SleepMode::offload);
  r.sleep_ns = alloc.stats().modeled_driver_ns - before;
  r.sleep_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  before = alloc.stats().modeled_driver_ns;
  alloc.wake_pool(1);
  r.wake_ns = alloc.stats().modeled_driver_ns - before;
  r.wake_s = seconds_since(t0);
  per_allocation_ns(blocks, &r.base_sleep_ns, &r.base_wake_ns);
  for (void* p : ptrs) alloc.deallocate(p, nullptr);
  alloc.release_pool(1);
  return r;
}

double gib_per_s(size_t bytes, double ns) { return ns > 0 ? (double(bytes) / GiB) / (ns * 1e-9) : 0; }

void print(const Result& r, const char* how) {
  std::printf("%8.0f  %-12s %9.3f %9.3f %9.1f %9.1f   %9.3f %9.3f %9.1f %9.1f   %9.1f %9.1f%s\n",
              double(r.bytes) / GiB, how, r.sleep_ns * 1e-9, r.wake_ns * 1e-9,
              gib_per_s(r.bytes, r.sleep_ns), gib_per_s(r.bytes, r.wake_ns),
              r.base_sleep_ns * 1e-9, r.base_wake_ns * 1e-9, gib_per_s(r.bytes, r.base_sleep_ns),
              gib_per_s(r.bytes, r.base_wake_ns), gib_per_s(r.bytes, r.sleep_s * 1e9),
              gib_per_s(r.bytes, r.wake_s * 1e9), r.sleep_s > 0 ? "" : "  (not run)");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10) * GiB);
  const char* conf = expanse::bench::real_driver_conf();
  const bool real = conf != nullptr;
  if (sizes.empty()) sizes = {1 * GiB, 2 * GiB};
  std::printf("sleep (offload) and wake of a weights pool; modeled on the default cost table; "
              "timed on %s\n", real ? conf : "the sim (this machine's time, not a GPU figure)");
  std::printf("%8s  %-12s %9s %9s %9s %9s   %9s %9s %9s %9s   %9s %9s\n", "GiB", "", "sleep s",
              "wake s", "sleep G/s", "wake G/s", "base slp", "base wake", "base s G/s",
              "base w G/s", "timed slp", "timed wk");
  std::vector<Result> measured;
  for (size_t s : sizes) {
    measured.push_back(measure(s));
    print(measured.back(), "measured");
  }
  // Larger sizes: scaled per byte from the largest measured size (copies and handle counts grow
  // linearly with the bytes of a model's weights); the baseline is computed, not scaled.
  if (real) return 0;  // a GPU's figures are measured, never extrapolated
  const Result& big = measured.back();
  for (size_t s : {8 * GiB, 40 * GiB}) {
    if (s <= big.bytes) continue;
    const double k = double(s) / double(big.bytes);
    Result r{};
    r.bytes = s;
    r.sleep_ns = big.sleep_ns * k;
    r.wake_ns = big.wake_ns * k;
    per_allocation_ns(weight_blocks(s), &r.base_sleep_ns, &r.base_wake_ns);
    print(r, "extrapolated");
  }
  std::printf("base: one handle and one synchronous copy per allocation (torch_memory_saver, "
              "vLLM CuMemAllocator), same cost table. timed slp / timed wk: GiB/s as timed here "
              "(on the sim: the sim's speed, not a GPU figure).\n");
  return 0;
}
