// A property of training runs whose steps vary in shape (workloads/transformer_steps.hpp: random
// batch and length each step, backward on a second thread), replayed on expanse with the default
// host model beside the model of PyTorch's expandable segments, for many seeds. Once the run has
// shown its range of shapes (from the 10th step on): expanse holds at most what expandable
// segments held so far + 64 MiB, and where expandable segments make no driver call in a step and
// expanse's own peak does not grow, expanse neither creates nor releases physical memory.
//
// Both are disabled while expanse does not meet them: run them with
// --gtest_also_run_disabled_tests; each prints a summary line over all seeds, and the step-by-step
// figures of every seed that fails. EXPANSE_VARYING_SEEDS=N replays seeds 1..N (default kSeeds).
#include "conf/config.hpp"
#include "models/torch_model_run.hpp"
#include "replay/replay.hpp"
#include "trace/torch_settings.hpp"
#include "workloads/transformer_steps.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace expanse::test {
namespace {

using driver::EntryPoint;

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr int kSteps = 30;
constexpr size_t kFirstCheckedStep = 10;  // 1-based
constexpr uint64_t kSlack = 64 * MiB;
constexpr int kSeeds = 100;

// One step's figures, both allocators.
struct Step {
  uint64_t batch = 0, length = 0;
  uint64_t es_calls = 0;               // expandable segments' driver calls in the step
  uint64_t es_peak = 0;                // their peak reserved so far
  uint64_t calls = 0;                  // expanse's driver calls in the step
  uint64_t creates = 0, releases = 0;  // of them, cuMemCreate and cuMemRelease
  uint64_t physical = 0;               // expanse's physical bytes at the step's end
  uint64_t peak = 0;                   // expanse's peak physical so far
};

struct SeedRun {
  uint64_t seed = 0;
  std::vector<Step> steps;
  std::string table() const {
    std::string out = "seed " + std::to_string(seed) +
                      ": step batch x length | ES calls, ES peak MiB | expanse calls (create, "
                      "release), physical MiB, peak MiB\n";
    char line[200];
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      std::snprintf(
          line, sizeof line, "%3zu %3llux%-5llu | %6llu %9.1f | %6llu (%llu, %llu) %9.1f %9.1f\n",
          i + 1, static_cast<unsigned long long>(s.batch),
          static_cast<unsigned long long>(s.length), static_cast<unsigned long long>(s.es_calls),
          static_cast<double>(s.es_peak) / MiB, static_cast<unsigned long long>(s.calls),
          static_cast<unsigned long long>(s.creates), static_cast<unsigned long long>(s.releases),
          static_cast<double>(s.physical) / MiB, static_cast<double>(s.peak) / MiB);
      out += line;
    }
    return out;
  }
};

int seeds() {
  const char* v = std::getenv("EXPANSE_VARYING_SEEDS");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : kSeeds;
}

SeedRun replay_seed(uint64_t seed) {
  replay::TransformerSteps shape;
  shape.steps = kSteps;
  shape.seed = seed;
  const replay::TransformerRun workload = replay::transformer_steps(shape);
  const uint64_t capacity = uint64_t{80} << 30;

  trace::TorchSettings es;
  es.expandable_segments = true;
  replay::TorchRunOptions to;
  to.capacity = capacity;
  to.record_events = false;
  to.marks = workload.step_ends;
  const replay::TorchRun model = replay::run_torch_model(workload.trace, es, to);

  replay::ReplayOptions ro;  // the default host model: PyTorch's path, the GPU running behind
  ro.marks = workload.step_ends;
  const replay::ReplayResult ex =
      replay::replay_trace(workload.trace, conf::parse_config(""), capacity, ro);

  SeedRun r;
  r.seed = seed;
  EXPECT_EQ(model.ooms, 0u);
  EXPECT_EQ(ex.ooms, 0u) << ex.first_oom;
  EXPECT_EQ(model.marks.size(), workload.step_ends.size());
  EXPECT_EQ(ex.marks.size(), workload.step_ends.size());
  const size_t n = std::min(model.marks.size(), ex.marks.size());
  for (size_t i = 0; i < n; ++i) {
    const replay::TorchMark& m = model.marks[i];
    const replay::ReplayMark& x = ex.marks[i];
    const replay::TorchMark* pm = i > 0 ? &model.marks[i - 1] : nullptr;
    const replay::ReplayMark* px = i > 0 ? &ex.marks[i - 1] : nullptr;
    auto calls_of = [&](EntryPoint e) {
      const auto k = static_cast<size_t>(e);
      return x.driver_calls[k] - (px != nullptr ? px->driver_calls[k] : 0);
    };
    Step s;
    s.batch = workload.batch[i];
    s.length = workload.length[i];
    s.es_calls = m.driver_calls_total - (pm != nullptr ? pm->driver_calls_total : 0);
    s.es_peak = m.peak_reserved;
    s.calls = x.driver_calls_total - (px != nullptr ? px->driver_calls_total : 0);
    s.creates = calls_of(EntryPoint::mem_create);
    s.releases = calls_of(EntryPoint::mem_release);
    s.physical = x.physical_bytes;
    s.peak = x.peak_physical_bytes;
    r.steps.push_back(s);
  }
  return r;
}

// The replays, once for both properties.
const std::vector<SeedRun>& runs() {
  static const std::vector<SeedRun> all = [] {
    std::vector<SeedRun> v;
    for (int seed = 1; seed <= seeds(); ++seed) {
      v.push_back(replay_seed(static_cast<uint64_t>(seed)));
    }
    return v;
  }();
  return all;
}

// Peaks so far on both sides, so that every moment of a step counts, not only its end.
TEST(VaryingSteps, DISABLED_PhysicalAtMostExpandableSegmentsPeakPlus64MiB) {
  size_t over = 0, seeds_over = 0;
  double most = -1e30;  // MiB expanse's peak was above theirs, at worst
  std::string where;
  for (const SeedRun& r : runs()) {
    ASSERT_EQ(r.steps.size(), static_cast<size_t>(kSteps));
    size_t here = 0;
    for (size_t i = kFirstCheckedStep - 1; i < r.steps.size(); ++i) {
      const Step& s = r.steps[i];
      here += s.peak > s.es_peak + kSlack ? 1 : 0;
      const double above = (static_cast<double>(s.peak) - static_cast<double>(s.es_peak)) / MiB;
      if (above > most) {
        most = above;
        where = "seed " + std::to_string(r.seed) + ", step " + std::to_string(i + 1);
      }
    }
    over += here;
    seeds_over += here != 0 ? 1 : 0;
    EXPECT_EQ(here, 0u) << here << " steps from step " << kFirstCheckedStep
                        << " on where expanse's peak physical exceeds expandable segments' peak "
                           "reserved + 64 MiB\n"
                        << r.table();
  }
  std::printf("steps over the bound %zu, in %zu of %d seeds; expanse's peak at most %.0f MiB "
              "above theirs (%s)\n",
              over, seeds_over, seeds(), most, where.c_str());
}

// Counts the steps (from the 10th on) where expandable segments made no call and expanse's peak
// did not grow, and of them those where expanse created or released physical memory.
TEST(VaryingSteps, DISABLED_NoCreateOrReleaseWhereExpandableSegmentsSettled) {
  size_t settled = 0, churned = 0, seeds_churned = 0;
  for (const SeedRun& r : runs()) {
    size_t here = 0;
    for (size_t i = kFirstCheckedStep - 1; i < r.steps.size(); ++i) {
      const Step& s = r.steps[i];
      if (s.es_calls != 0 || s.peak > r.steps[i - 1].peak) continue;
      ++settled;
      if (s.creates != 0 || s.releases != 0) ++here;
    }
    churned += here;
    seeds_churned += here != 0 ? 1 : 0;
    EXPECT_EQ(here, 0u) << here << " steps with cuMemCreate/cuMemRelease where expandable "
                        << "segments made no driver call and expanse's peak did not grow\n"
                        << r.table();
  }
  std::printf("settled steps %zu, of them with cuMemCreate/cuMemRelease %zu, in %zu of %d seeds\n",
              settled, churned, seeds_churned, seeds());
}

// The per-step figures above come from the replay's marks: per entry point, adding up to the
// mark's total, and never going back.
TEST(ReplayMarks, PerEntryPointCountsAddUpToTheTotal) {
  replay::TransformerSteps shape;
  shape.steps = 3;
  const replay::TransformerRun workload = replay::transformer_steps(shape);
  replay::ReplayOptions ro;
  ro.marks = workload.step_ends;
  const replay::ReplayResult ex =
      replay::replay_trace(workload.trace, conf::parse_config(""), uint64_t{80} << 30, ro);
  ASSERT_EQ(ex.marks.size(), 3u);
  for (size_t i = 0; i < ex.marks.size(); ++i) {
    const replay::ReplayMark& m = ex.marks[i];
    uint64_t sum = 0;
    for (uint64_t c : m.driver_calls) sum += c;
    EXPECT_EQ(sum, m.driver_calls_total) << "step " << i + 1;
    if (i > 0) {
      for (size_t e = 0; e < m.driver_calls.size(); ++e) {
        EXPECT_GE(m.driver_calls[e], ex.marks[i - 1].driver_calls[e]);
      }
    }
  }
  EXPECT_GT(ex.marks[0].driver_calls[static_cast<size_t>(EntryPoint::mem_create)], 0u);
}

}  // namespace
}  // namespace expanse::test
