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
//       (a real GPU: the timed columns are the figures and come first; nothing is extrapolated)
//
// One table per run; each column says where its figure comes from (modeled, base mod. for the
// per-allocation strategy, timed) and its unit (docs/performance.md, "Sleep and wake").
#include "bench_driver.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "driver_api/cost_model.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
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
  size_t bytes = 0;
  bool extrapolated = false;
  double sleep_ns = 0, wake_ns = 0;  // expanse, modeled
  double first_ns = -1;              // modeled sleep + wake of the first cycle (< 0: not run)
  double base_sleep_ns = 0, base_wake_ns = 0;  // per-allocation strategy, modeled
  double sleep_s = -1, wake_s = -1, first_s = -1;  // timed (< 0: not run): a GPU's figures on
                                                   // the real driver; on the sim, the sim's own
};

// The real driver when EXPANSE_BENCH_CONF names one (driver:cuda), else a sim device with room
// for the pool and the rest of the run.
std::unique_ptr<expanse::driver::LoadedDriver> open_driver(size_t total) {
  return expanse::bench::open_bench_driver(total + total / 2 + GiB, true, "sleep-wake-bench");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The driver the figures were measured on.
struct Run {
  std::string driver;  // its description
  bool gpu = false;    // the CUDA driver (a GPU): the timed figures are the GPU's
};

Result measure(size_t total, Run* run) {
  auto drv = open_driver(total);
  run->driver = drv->description();
  run->gpu = drv->kind() == expanse::driver::DriverKind::cuda;
  expanse::core::DeviceAllocator alloc(*drv, 0, expanse::core::AllocatorOptions{});
  alloc.create_pool(1);
  const std::vector<size_t> blocks = weight_blocks(total);
  std::vector<void*> ptrs;
  for (size_t n : blocks) ptrs.push_back(alloc.allocate(n, nullptr, 1));
  Result r{};
  r.bytes = total;
  // A first cycle makes the pinned staging (kept across cycles) and maps the live blocks with
  // large handles at wake (a pool maps its memory one page per handle when it allocates): the
  // second is the steady state of an engine put to sleep again and again. Both are reported.
  auto t0 = std::chrono::steady_clock::now();
  double before = alloc.stats().modeled_driver_ns;
  alloc.sleep_pool(1, expanse::core::DeviceAllocator::SleepMode::offload);
  alloc.wake_pool(1);
  r.first_ns = alloc.stats().modeled_driver_ns - before;
  r.first_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  before = alloc.stats().modeled_driver_ns;
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

double gib_per_s(size_t bytes, double ns) {
  return ns > 0 ? (double(bytes) / GiB) / (ns * 1e-9) : -1;
}
double ms(double ns) { return ns < 0 ? -1 : ns * 1e-6; }
double s_to_ms(double s) { return s < 0 ? -1 : s * 1e3; }
double timed_gib_per_s(const Result& r, double s) {
  return s < 0 ? -1 : gib_per_s(r.bytes, s * 1e9);
}

// One column: where its figure comes from (the header's first line), what it is with its unit
// (the second), and the figure for a row (< 0: none, printed as "-").
struct Column {
  const char* source;
  const char* what;
  double (*value)(const Result&);
};

// Columns of one source, and the line under the table that says what the source is.
struct Group {
  std::vector<Column> columns;
  std::string legend;
};

Group modeled() {
  return {{{"modeled", "sleep ms", [](const Result& r) { return ms(r.sleep_ns); }},
           {"modeled", "wake ms", [](const Result& r) { return ms(r.wake_ns); }},
           {"modeled", "sleep GiB/s",
            [](const Result& r) { return gib_per_s(r.bytes, r.sleep_ns); }},
           {"modeled", "wake GiB/s", [](const Result& r) { return gib_per_s(r.bytes, r.wake_ns); }},
           {"modeled", "1st cyc ms", [](const Result& r) { return ms(r.first_ns); }}},
          "modeled: expanse's driver calls and copies priced by the default cost table (H100)"};
}

Group base() {
  return {{{"base mod.", "sleep ms", [](const Result& r) { return ms(r.base_sleep_ns); }},
           {"base mod.", "wake ms", [](const Result& r) { return ms(r.base_wake_ns); }},
           {"base mod.", "sleep GiB/s",
            [](const Result& r) { return gib_per_s(r.bytes, r.base_sleep_ns); }},
           {"base mod.", "wake GiB/s",
            [](const Result& r) { return gib_per_s(r.bytes, r.base_wake_ns); }}},
          "base mod.: one handle and one synchronous copy per allocation (torch_memory_saver, "
          "vLLM CuMemAllocator), priced by the same table"};
}

Group timed(bool gpu) {
  return {{{"timed", "sleep ms", [](const Result& r) { return s_to_ms(r.sleep_s); }},
           {"timed", "wake ms", [](const Result& r) { return s_to_ms(r.wake_s); }},
           {"timed", "sleep GiB/s", [](const Result& r) { return timed_gib_per_s(r, r.sleep_s); }},
           {"timed", "wake GiB/s", [](const Result& r) { return timed_gib_per_s(r, r.wake_s); }},
           {"timed", "1st cyc ms", [](const Result& r) { return s_to_ms(r.first_s); }}},
          std::string("timed: this run's wall clock, ") +
              (gpu ? "on the GPU" : "on the sim (this machine's speed, not a GPU figure)")};
}

// One table: the timed figures first where a GPU ran (they are its figures), else the modeled
// ones first (the timed ones are the sim's speed on this machine); then what each source is.
void print_table(const std::vector<Result>& rows, bool gpu) {
  std::vector<Group> groups;
  if (gpu) groups.push_back(timed(gpu));
  groups.push_back(modeled());
  groups.push_back(base());
  if (!gpu) groups.push_back(timed(gpu));
  std::vector<Column> cols;
  for (const Group& g : groups) cols.insert(cols.end(), g.columns.begin(), g.columns.end());
  std::printf("%6s  %-12s", "", "");
  for (const Column& c : cols) std::printf(" %11s", c.source);
  std::printf("\n%6s  %-12s", "GiB", "sizes");
  for (const Column& c : cols) std::printf(" %11s", c.what);
  std::printf("\n");
  bool any_missing = false;
  for (const Result& r : rows) {
    std::printf("%6.0f  %-12s", double(r.bytes) / GiB,
                r.extrapolated ? "extrapolated" : "measured");
    for (const Column& c : cols) {
      const double v = c.value(r);
      any_missing = any_missing || v < 0;
      if (v < 0) {
        std::printf(" %11s", "-");
      } else {
        std::printf(" %11.1f", v);
      }
    }
    std::printf("\n");
  }
  for (const Group& g : groups) std::printf("%s\n", g.legend.c_str());
  std::printf("1st cyc: sleep + wake of the first cycle after loading (pinned staging made, pages "
              "mapped one per handle)\n");
  if (any_missing) {
    std::printf("-: not run (extrapolated rows are scaled per byte from the largest measured "
                "size)\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10) * GiB);
  if (sizes.empty()) sizes = {1 * GiB, 2 * GiB};
  Run run;
  std::vector<Result> rows;
  for (size_t s : sizes) rows.push_back(measure(s, &run));
  // Larger sizes on the sim: scaled per byte from the largest measured size (copies and handle
  // counts grow linearly with the bytes of a model's weights); the baseline is computed, not
  // scaled. A GPU's figures are measured, never extrapolated.
  if (!run.gpu) {
    const Result big = rows.back();
    for (size_t s : {8 * GiB, 40 * GiB}) {
      if (s <= big.bytes) continue;
      const double k = double(s) / double(big.bytes);
      Result r{};
      r.bytes = s;
      r.extrapolated = true;
      r.sleep_ns = big.sleep_ns * k;
      r.wake_ns = big.wake_ns * k;
      per_allocation_ns(weight_blocks(s), &r.base_sleep_ns, &r.base_wake_ns);
      rows.push_back(r);
    }
  }
  std::printf("sleep (offload) and wake of a weights pool, steady state (the second cycle); "
              "driver %s\n",
              run.gpu ? run.driver.c_str()
                      : "sim (a device per size, pages backed by host memory)");
  print_table(rows, run.gpu);
  return 0;
}
