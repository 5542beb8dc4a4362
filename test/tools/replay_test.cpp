// Replay on the sim and the minimum-capacity search.
#include "replay/replay.hpp"
#include "tools_test_util.hpp"

#include "driver/env_config.hpp"
#include "expanse/errors.hpp"

#include <gtest/gtest.h>

#include <string>

namespace expanse::test {
namespace {

using replay::load_rmm_csv;
using replay::load_snapshot;
using replay::Trace;

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

api::Config sim_conf() { return api::parse_config(""); }

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

TEST(Replay, TooSmallADeviceCountsOoms) {
  Trace t = load_rmm_csv("sample.csv", sample_csv());
  replay::ReplayResult r = replay::replay_trace(t, sim_conf(), 64 * MiB);
  EXPECT_GT(r.ooms, 0u);
  EXPECT_NE(r.first_oom.find("out of memory"), std::string::npos);
  EXPECT_EQ(r.ops_done, t.ops.size());  // the replay goes on past an OOM
  replay::ReplayResult s = replay::replay_trace(t, sim_conf(), 64 * MiB, true);
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
  EXPECT_THROW(replay::find_min_capacity(t, sim_conf(), 1 * GiB), replay::input_error);
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
