// ns per cached allocate+free pair on expanse (no driver call: the block's pages stay mapped)
// next to glibc malloc/free of the same sizes, from the same run. Single- and multi-threaded.
//
//   build/bin/expanse_bench_hot_path            (table at the end)
//   build/bin/expanse_bench_hot_path --benchmark_filter=expanse/.*/threads:8
//   EXPANSE_BENCH_CONF=driver:cuda build/bin/expanse_bench_hot_path   (a real GPU's driver: what
//   stream identity (cuStreamGetId per call) costs there; the sim's version takes a global lock)
#include "bench_driver.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr size_t kSizes[] = {512, 4096, 65536, size_t{1} << 20, size_t{16} << 20,
                             size_t{256} << 20};

struct Fixture {
  std::unique_ptr<expanse::driver::LoadedDriver> drv;
  std::unique_ptr<expanse::core::DeviceAllocator> alloc;
  std::vector<CUstream> streams;
  Fixture() {
    drv = expanse::bench::open_bench_driver(size_t{80} << 30, false, "benchmark");
    std::printf("driver: %s\n", drv->description().c_str());
    alloc = std::make_unique<expanse::core::DeviceAllocator>(*drv, 0,
                                                             expanse::core::AllocatorOptions{});
    const auto& t = drv->table();
    using expanse::driver::EntryPoint;
    CUdevice dev = 0;  // the driver's handle for ordinal 0 (not the ordinal itself)
    drv->check(t.device_get(&dev, 0), EntryPoint::device_get);
    CUcontext ctx = nullptr;
    drv->check(t.device_primary_ctx_retain(&ctx, dev), EntryPoint::device_primary_ctx_retain);
    drv->check(t.ctx_set_current(ctx), EntryPoint::ctx_set_current);
    for (int i = 0; i < 64; ++i) {
      CUstream s = nullptr;
      drv->check(t.stream_create(&s, CU_STREAM_NON_BLOCKING), EntryPoint::stream_create);
      streams.push_back(s);
    }
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void expanse_pair(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  auto& a = *fixture().alloc;
  // Each thread uses its own stream, as a real server would.
  CUstream stream = fixture().streams[static_cast<size_t>(state.thread_index())];
  a.deallocate(a.allocate(n, stream), stream);  // warm: pages mapped, block cached
  uint64_t calls = 0;
  bool first = true;
  for (auto _ : state) {
    if (first) {  // every thread has warmed up once the timed loop runs
      calls = a.stats().total_driver_calls();
      first = false;
    }
    void* p = a.allocate(n, stream);
    benchmark::DoNotOptimize(p);
    a.deallocate(p, stream);
  }
  if (state.threads() == 1 && a.stats().total_driver_calls() != calls) {
    state.SkipWithError("the hot path made driver calls");
  }
}

void glibc_pair(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

// Collects results to print the side-by-side table after the usual output.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      std::string name = r.benchmark_name();
      results_[name] = r.GetAdjustedRealTime();
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\ncached allocate+free pair, ns (real time per pair; threads share one device)\n");
    std::printf("%12s %8s %12s %12s %8s\n", "size", "threads", "expanse", "glibc", "ratio");
    for (size_t n : kSizes) {
      for (int t : {1, 8}) {
        std::string suffix = "/" + std::to_string(n) + "/real_time" +
                             (t == 1 ? std::string() : "/threads:" + std::to_string(t));
        auto e = results_.find("expanse" + suffix);
        auto g = results_.find("glibc" + suffix);
        if (e == results_.end() || g == results_.end()) continue;
        std::printf("%12zu %8d %12.1f %12.1f %8.2f\n", n, t, e->second, g->second,
                    e->second / g->second);
      }
    }
  }

 private:
  std::map<std::string, double> results_;
};

}  // namespace

int main(int argc, char** argv) {
  for (size_t n : kSizes) {
    for (int t : {1, 8}) {
      auto* e = benchmark::RegisterBenchmark("expanse", expanse_pair)
                    ->Arg(static_cast<int64_t>(n))
                    ->UseRealTime();
      auto* g = benchmark::RegisterBenchmark("glibc", glibc_pair)
                    ->Arg(static_cast<int64_t>(n))
                    ->UseRealTime();
      if (t > 1) {
        e->Threads(t);
        g->Threads(t);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
