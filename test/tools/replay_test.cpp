// Replay on the sim and the minimum-capacity search.
#include "replay/replay.hpp"
#include "tools_test_util.hpp"

#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <gtest/gtest.h>

#include <string>

namespace expanse::test {
namespace {

using trace::load_rmm_csv;
using trace::load_snapshot;
using trace::Trace;

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr uint64_t GiB = uint64_t{1} << 30;

// A training-step-like trace on two streams: 40 activations of 3 MiB + 1 KiB, half freed in the
// middle, small blocks interleaved, then a 200 MiB buffer.
std::string sample_csv() {
  std::string csv = "Thread,Time,Action,Pointer,Size,Stream\n";
  char line[160];
  auto row = [&](const char* action, uint64_t ptr, uint64_t size, uint64_t stream) {
    std::snprintf(line, sizeof line, "1,t,%s,0x%llx,%llu,0x%llx\n", action,
                  static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(size),
                  static_cast<unsigned long long>(stream));
    csv += line;
  };
  const uint64_t base = 0x7f0000000000;
  for (uint64_t i = 0; i < 40; ++i) {
    row("allocate", base + i * 8 * MiB, 3 * MiB + 1024, i % 2 == 0 ? 0 : 0x55);
    row("allocate", base + 0x100000000 + i * 4096, 700, 0);
  }
  for (uint64_t i = 0; i < 40; i += 2) row("free", base + i * 8 * MiB, 3 * MiB + 1024, 0);
  row("allocate", base + 0x200000000, 200 * MiB, 0x55);
  return csv;
}

conf::Config sim_conf() { return conf::parse_config(""); }

replay::ReplayOptions passes(int n) {
  replay::ReplayOptions o;
  o.passes = n;
  return o;
}

replay::ReplayOptions stop_first(int n) {
  replay::ReplayOptions o = passes(n);
  o.stop_at_first_oom = true;
  return o;
}

TEST(Replay, SmallTraceReplaysWithoutOom) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  ASSERT_EQ(t.streams.size(), 2u);
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 8 * GiB);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.ops_done, t.ops.size());
  EXPECT_EQ(r.page_size, 2 * MiB);
  EXPECT_EQ(r.stats.peak_requested_bytes, t.peak_live_bytes);
  EXPECT_GE(r.stats.peak_mapped_bytes, t.peak_live_bytes);
  EXPECT_GT(r.stats.total_driver_calls(), 0u);
  EXPECT_GT(r.stats.modeled_driver_ns, 0.0);
}

TEST(Replay, OnePassIsTheWholeReplay) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 8 * GiB);
  ASSERT_EQ(r.passes.size(), 1u);
  EXPECT_EQ(r.passes[0].driver_calls_total, r.stats.total_driver_calls());
  EXPECT_DOUBLE_EQ(r.passes[0].modeled_driver_seconds, r.stats.modeled_driver_ns * 1e-9);
  EXPECT_EQ(r.passes[0].peak_physical_bytes, r.stats.peak_physical_bytes);
  EXPECT_EQ(r.passes[0].ooms, 0u);
}

TEST(Replay, RepeatedPassesReachSteadyState) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  const replay::ReplayResult one = replay::replay_trace(t, sim_conf(), 8 * GiB);
  const replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 8 * GiB, passes(3));
  ASSERT_EQ(r.passes.size(), 3u);
  EXPECT_EQ(r.ops_done, 3 * t.ops.size());
  EXPECT_EQ(r.ooms, 0u);
  // The first pass is the single replay; later ones find the pages they need cached. A stream's
  // frees are fenced only from its own calls (another stream's handle may be dead: never
  // touched), so pass 2 may map a little more while the other stream's frees are unproven.
  EXPECT_EQ(r.passes[0].driver_calls_total, one.stats.total_driver_calls());
  EXPECT_EQ(r.passes[0].peak_physical_bytes, one.stats.peak_physical_bytes);
  uint64_t calls = 0;
  for (size_t i = 0; i < r.passes.size(); ++i) {
    calls += r.passes[i].driver_calls_total;
    EXPECT_LE(r.passes[i].peak_physical_bytes, one.stats.peak_physical_bytes * 11 / 10) << i;
    if (i > 0) {
      EXPECT_LE(r.passes[i].peak_physical_bytes, r.passes[i - 1].peak_physical_bytes * 11 / 10);
    }
    EXPECT_GE(r.passes[i].peak_mapped_bytes, t.peak_live_bytes) << i;
    // Pass 2 may still record and query a few events (pages cached on one stream reused on
    // the other); by pass 3 nothing is left to do.
    if (i == 1) {
      EXPECT_LT(r.passes[i].driver_calls_total * 4, r.passes[0].driver_calls_total) << i;
    }
    if (i == 2) {
      EXPECT_EQ(r.passes[i].driver_calls_total, 0u) << i;
      EXPECT_EQ(r.passes[i].modeled_driver_seconds, 0.0) << i;
    }
  }
  EXPECT_EQ(calls, r.stats.total_driver_calls());
  EXPECT_LE(r.stats.peak_physical_bytes, one.stats.peak_physical_bytes * 11 / 10);
  EXPECT_EQ(r.stats.num_allocs, 3 * one.stats.num_allocs);
}

TEST(Replay, BlocksLeftLiveByAPassAreFreedBeforeTheNext) {
  // The sample leaves 20 x 3 MiB, 40 small blocks and 200 MiB live: kept across passes, pass 2
  // would need twice that on the smallest device that holds one pass.
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  ASSERT_GT(t.live_at_end_bytes, 200 * MiB);
  const replay::MinCapacity m = replay::find_min_capacity(t, sim_conf(), 1 * GiB);
  ASSERT_LT(m.bytes, t.peak_live_bytes + t.live_at_end_bytes);
  const replay::ReplayResult r = replay::replay_trace(t, sim_conf(), m.bytes, passes(3));
  EXPECT_EQ(r.ooms, 0u) << r.first_oom;
  // At the end, exactly what the last pass left live is live.
  EXPECT_EQ(r.stats.live_blocks, t.allocs - t.frees);
  EXPECT_EQ(r.stats.requested_bytes, t.live_at_end_bytes);
}

TEST(Replay, StopAtFirstOomEndsEveryPass) {
  // 10 MiB never freed, then 10 MiB freed at once: on 20 MiB both passes fit only if the first
  // block is freed between passes; on 10 MiB the second alloc fails, and nothing runs after it.
  std::string csv = "Thread,Time,Action,Pointer,Size,Stream\n";
  csv += "1,t,allocate,0x1000000,10485760,0x0\n";
  csv += "1,t,allocate,0x2000000,10485760,0x0\n";
  csv += "1,t,free,0x2000000,10485760,0x0\n";
  Trace t = load_rmm_csv("two.csv", csv);
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 20 * MiB, passes(2));
  EXPECT_EQ(r.ooms, 0u) << r.first_oom;
  r = replay::replay_trace(t, sim_conf(), 10 * MiB, stop_first(2));
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.first_oom_pass, 1);
  EXPECT_EQ(r.first_oom_op, 1u);
  EXPECT_EQ(r.passes.size(), 1u);
  EXPECT_EQ(r.ops_done, 1u);
}

TEST(Replay, APeakNoDeviceHoldsIsAnInputErrorForTheSearch) {
  // 2^62 + 2^61 bytes live: each replay counts OOMs; the search had overflowed its page counts
  // into a 0-byte device (an internal error) before.
  std::string csv = "Thread,Time,Action,Pointer,Size,Stream\n";
  csv += "1,t,allocate,0x1000,4611686018427387904,0x0\n";
  csv += "1,t,allocate,0x2000,2305843009213693952,0x0\n";
  Trace t = load_rmm_csv("huge.csv", csv);
  EXPECT_EQ(replay::replay_trace(t, sim_conf(), 80 * GiB).ooms, 2u);
  try {
    replay::find_min_capacity(t, sim_conf(), 80 * GiB);
    ADD_FAILURE() << "no error";
  } catch (const trace::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the largest device replay models"),
              std::string::npos)
        << e.what();
  }
  // A device above that is refused before any driver call.
  EXPECT_THROW(replay::replay_trace(t, sim_conf(), replay::kMaxReplayCapacity + 2 * MiB),
               usage_error);
}

TEST(Replay, TooSmallADeviceCountsOoms) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 64 * MiB);
  EXPECT_GT(r.ooms, 0u);
  EXPECT_NE(r.first_oom.find("out of memory"), std::string::npos);
  EXPECT_EQ(r.ops_done, t.ops.size());  // the replay goes on past an OOM
  replay::ReplayResult s = replay::replay_trace(t, sim_conf(), 64 * MiB, stop_first(1));
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(s.ops_done, s.first_oom_op);
}

TEST(Replay, ARequestNoDeviceCanHoldIsAnOom) {
  Trace t = load_rmm_csv("huge.csv",
                         "Thread,Time,Action,Pointer,Size,Stream\n"
                         "1,t,allocate,0x1000,100,0x0\n"
                         "1,t,allocate,0x2000,9223372036854775808,0x0\n"
                         "1,t,free,0x2000,9223372036854775808,0x0\n"
                         "1,t,free,0x1000,100,0x0\n");
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 1 * GiB);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.first_oom_op, 1u);
  EXPECT_EQ(r.ops_done, 4u);
  EXPECT_THROW(replay::find_min_capacity(t, sim_conf(), 1 * GiB), trace::input_error);
}

TEST(Replay, MinCapacityIsTheBoundary) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  replay::MinCapacity m = replay::find_min_capacity(t, sim_conf(), 80 * GiB);
  EXPECT_EQ(m.bytes % (2 * MiB), 0u);
  EXPECT_GE(m.bytes, t.peak_live_bytes);
  EXPECT_LE(m.bytes, t.peak_live_bytes + t.peak_live_bytes / 100 + 64 * MiB);
  EXPECT_EQ(m.at_min.ooms, 0u);
  EXPECT_EQ(replay::replay_trace(t, sim_conf(), m.bytes).ooms, 0u);
  EXPECT_GT(replay::replay_trace(t, sim_conf(), m.bytes - 2 * MiB).ooms, 0u);
  // Starting below the answer grows the bound first.
  replay::MinCapacity from_below = replay::find_min_capacity(t, sim_conf(), 16 * MiB);
  EXPECT_EQ(from_below.bytes, m.bytes);
}

TEST(Replay, SnapshotWithPreexistingBlocks) {
  const std::string data = read_file(fixture("snapshot_p4.pickle"));
  Trace t = load_snapshot("s.pickle", data);
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 1 * GiB);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.stats.peak_requested_bytes, t.peak_live_bytes);
  replay::MinCapacity m = replay::find_min_capacity(t, sim_conf(), 1 * GiB);
  EXPECT_EQ(m.bytes, 2 * MiB);  // all of it fits in one page
}

}  // namespace
}  // namespace expanse::test
