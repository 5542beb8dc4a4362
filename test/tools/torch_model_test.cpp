// The models of PyTorch's caching allocator on small hand-made sequences whose outcome follows
// from PyTorch's rules (CUDACachingAllocator.cpp), and properties over random sequences.
#include "models/torch_caching_model.hpp"
#include "models/torch_model_run.hpp"
#include "trace/torch_settings.hpp"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

namespace expanse::replay {
namespace {

constexpr uint64_t KiB = uint64_t{1} << 10;
constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr uint64_t kNoLimit = uint64_t{1} << 50;

using trace::parse_torch_conf;
using trace::torch_allocation_size;
using trace::torch_round_size;
using trace::TorchSettings;
using trace::Trace;
using trace::TraceOp;
using Kind = TorchSegmentEvent::Kind;

std::vector<std::pair<Kind, uint64_t>> events(const TorchCachingModel& m) {
  std::vector<std::pair<Kind, uint64_t>> out;
  for (const auto& e : m.segment_events()) out.push_back({e.kind, e.size});
  return out;
}

TEST(TorchSettings, RoundSize) {
  TorchSettings s;
  EXPECT_EQ(torch_round_size(s, 1), 512u);
  EXPECT_EQ(torch_round_size(s, 512), 512u);
  EXPECT_EQ(torch_round_size(s, 513), 1024u);
  EXPECT_EQ(torch_round_size(s, MiB + 1), MiB + 512);
  s.roundup_power2_divisions.fill(4);
  EXPECT_EQ(torch_round_size(s, 1200), 1536u);  // not above 4 x 512: plain 512 B rounding
  EXPECT_EQ(torch_round_size(s, 5000), 5120u);  // 4096 + one quarter of 4096
  EXPECT_EQ(torch_round_size(s, 4096), 4096u);  // powers of two stay
  EXPECT_EQ(torch_round_size(s, 300 * MiB), 320 * MiB);
}

TEST(TorchSettings, AllocationSize) {
  EXPECT_EQ(torch_allocation_size(512), 2 * MiB);
  EXPECT_EQ(torch_allocation_size(MiB), 2 * MiB);
  EXPECT_EQ(torch_allocation_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(torch_allocation_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(torch_allocation_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(torch_allocation_size(11 * MiB + 512), 12 * MiB);
}

TEST(TorchSettings, ParsesAllocConf) {
  TorchSettings s = parse_torch_conf(
      "max_split_size_mb:128, roundup_power2_divisions:[256:1,512:2,>:8],"
      "expandable_segments:True,garbage_collection_threshold:0.6,"
      "release_lock_on_cudamalloc:True");
  EXPECT_EQ(s.max_split_size, 128 * MiB);
  EXPECT_TRUE(s.expandable_segments);
  EXPECT_DOUBLE_EQ(s.garbage_collection_threshold, 0.6);
  EXPECT_EQ(s.roundup_power2_divisions[0], 1u);  // the first interval fills those below it
  EXPECT_EQ(s.roundup_power2_divisions[8], 1u);
  EXPECT_EQ(s.roundup_power2_divisions[9], 8u);  // '>' from the last one given
  EXPECT_EQ(s.roundup_power2_divisions[15], 8u);
  EXPECT_EQ(parse_torch_conf("max_split_size_mb:5").max_split_size, 20 * MiB);  // raised to 20
  EXPECT_EQ(parse_torch_conf("roundup_power2_divisions:4").roundup_power2_divisions[7], 4u);
  for (const char* bad :
       {"foo:1", "max_split_size_mb:x", "expandable_segments:yes", "roundup_power2_divisions:3",
        "garbage_collection_threshold:1.5", "backend:cudaMallocAsync", "max_split_size_mb"}) {
    EXPECT_THROW(parse_torch_conf(bad), std::invalid_argument) << bad;
  }
  try {
    parse_torch_conf("foo:1");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'foo'"), std::string::npos) << e.what();
  }
  // to_conf gives back what parses to the same settings.
  TorchSettings again = parse_torch_conf(s.to_conf());
  EXPECT_EQ(again.max_split_size, s.max_split_size);
  EXPECT_EQ(again.roundup_power2_divisions, s.roundup_power2_divisions);
  EXPECT_EQ(again.expandable_segments, s.expandable_segments);
}

TEST(TorchCachingModel, SmallRequestsShareTwoMiBSegments) {
  TorchCachingModel m({}, kNoLimit);
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(m.malloc(i, 512 * KiB, 0));
  EXPECT_EQ(m.reserved(), 2 * MiB);
  ASSERT_TRUE(m.malloc(4, 1, 0));  // the first segment is full
  EXPECT_EQ(m.reserved(), 4 * MiB);
  EXPECT_EQ(m.allocated(), 4 * 512 * KiB + 512);
  EXPECT_EQ(events(m), (std::vector<std::pair<Kind, uint64_t>>{{Kind::segment_alloc, 2 * MiB},
                                                               {Kind::segment_alloc, 2 * MiB}}));
}

TEST(TorchCachingModel, MidSizeRequestsSplitTwentyMiBSegments) {
  TorchCachingModel m({}, kNoLimit);
  // Six 3 MiB requests fit one 20 MiB segment (2 MiB left, split off as > 1 MiB), a 7th not.
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(m.malloc(i, 3 * MiB, 0));
  EXPECT_EQ(m.reserved(), 20 * MiB);
  ASSERT_TRUE(m.malloc(6, 3 * MiB, 0));
  EXPECT_EQ(m.reserved(), 40 * MiB);
  EXPECT_EQ(m.allocated(), 21 * MiB);
}

TEST(TorchCachingModel, RemainderUpToOneMiBIsNotSplitInTheLargePool) {
  TorchCachingModel m({}, kNoLimit);
  ASSERT_TRUE(m.malloc(0, 19 * MiB + 512 * KiB, 0));  // its own 20 MiB segment
  EXPECT_EQ(m.reserved(), 20 * MiB);
  EXPECT_EQ(m.allocated(), 20 * MiB);  // the 512 KiB rest stays in the block
}

TEST(TorchCachingModel, FreedBlocksMergeAndAreReused) {
  TorchCachingModel m({}, kNoLimit);
  ASSERT_TRUE(m.malloc(0, 3 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 3 * MiB, 0));
  m.free(0);
  m.free(1);  // merges with block 0 and the 14 MiB rest: one free 20 MiB block
  ASSERT_TRUE(m.malloc(2, 18 * MiB, 0));  // 18 MiB >= 10 MiB but a cached block fits
  EXPECT_EQ(m.reserved(), 20 * MiB);
  EXPECT_EQ(m.segment_events().size(), 1u);
}

TEST(TorchCachingModel, BestFitTakesTheSmallestBlockThatFits) {
  TorchCachingModel m({}, kNoLimit);
  ASSERT_TRUE(m.malloc(0, 30 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 14 * MiB, 0));
  m.free(0);
  m.free(1);
  ASSERT_TRUE(m.malloc(2, 13 * MiB, 0));  // the 14 MiB block, not a cut of the 30 MiB one
  ASSERT_TRUE(m.malloc(3, 29 * MiB, 0));  // so the 30 MiB block is still whole
  EXPECT_EQ(m.reserved(), 44 * MiB);
  EXPECT_EQ(m.segment_events().size(), 2u);
}

TEST(TorchCachingModel, ReleasesCachedSegmentsAndRetriesBeforeAnOom) {
  TorchCachingModel m({}, 24 * MiB);
  ASSERT_TRUE(m.malloc(0, 12 * MiB, 0));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 16 * MiB, 0));  // cudaMalloc fails; the cached 12 MiB goes; retry
  EXPECT_EQ(m.oom_count(), 0u);
  EXPECT_EQ(events(m), (std::vector<std::pair<Kind, uint64_t>>{{Kind::segment_alloc, 12 * MiB},
                                                               {Kind::segment_free, 12 * MiB},
                                                               {Kind::segment_alloc, 16 * MiB}}));
  EXPECT_EQ(m.peak_reserved(), 16 * MiB);
  EXPECT_EQ(m.driver_calls().by_name().at("cudaMalloc"), 3u);  // one failed
  EXPECT_EQ(m.driver_calls().by_name().at("cudaFree"), 1u);
}

TEST(TorchCachingModel, OomFromFragmentation) {
  TorchCachingModel m({}, 40 * MiB);
  // Two 20 MiB segments of six 3 MiB blocks each; every other block freed: 9 MiB free in
  // 3 MiB pieces per segment, none of it releasable (the segments are split).
  uint32_t id = 0;
  for (; id < 12; ++id) ASSERT_TRUE(m.malloc(id, 3 * MiB, 0));
  for (uint32_t i = 0; i < 12; i += 2) m.free(i);
  EXPECT_FALSE(m.malloc(100, 12 * MiB, 0));
  ASSERT_TRUE(m.first_oom());
  const TorchOom& o = *m.first_oom();
  EXPECT_TRUE(o.fragmentation);
  EXPECT_EQ(o.reserved, 40 * MiB);
  EXPECT_EQ(o.allocated, 18 * MiB);
  EXPECT_EQ(o.largest_free_block, 3 * MiB);
}

TEST(TorchCachingModel, OomFromExhaustion) {
  TorchCachingModel m({}, 40 * MiB);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(m.malloc(i, 12 * MiB, 0));
  EXPECT_FALSE(m.malloc(3, 12 * MiB, 0));
  ASSERT_TRUE(m.first_oom());
  EXPECT_FALSE(m.first_oom()->fragmentation);
  EXPECT_EQ(m.oom_count(), 1u);
  m.free(3);  // the failed block: a no-op
  EXPECT_EQ(m.allocated(), 36 * MiB);
}

TEST(TorchCachingModel, MaxSplitSizeKeepsOversizeBlocksForOversizeRequests) {
  TorchCachingModel m(parse_torch_conf("max_split_size_mb:20"), kNoLimit);
  ASSERT_TRUE(m.malloc(0, 30 * MiB, 0));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 5 * MiB, 0));  // may not cut the 30 MiB block: a new 20 MiB one
  EXPECT_EQ(m.reserved(), 50 * MiB);
  m.free(1);
  ASSERT_TRUE(m.malloc(2, 28 * MiB, 0));  // within 20 MiB of the oversize block: reused whole
  EXPECT_EQ(m.reserved(), 50 * MiB);
  EXPECT_EQ(m.allocated(), 30 * MiB);
}

TEST(TorchCachingModel, StreamsDoNotShareCachedBlocks) {
  TorchCachingModel m({}, kNoLimit);
  ASSERT_TRUE(m.malloc(0, 12 * MiB, 7));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 12 * MiB, 9));
  EXPECT_EQ(m.reserved(), 24 * MiB);
}

TEST(TorchExpandableModel, GrowsOneSegmentByPages) {
  TorchCachingModel m(parse_torch_conf("expandable_segments:True"), 1024 * MiB);
  ASSERT_TRUE(m.malloc(0, 3 * MiB, 0));  // one 20 MiB page
  ASSERT_TRUE(m.malloc(1, 3 * MiB, 0));  // same page
  EXPECT_EQ(m.reserved(), 20 * MiB);
  ASSERT_TRUE(m.malloc(2, 30 * MiB, 0));  // the 14 MiB tail plus one more page
  EXPECT_EQ(m.reserved(), 40 * MiB);
  EXPECT_EQ(events(m), (std::vector<std::pair<Kind, uint64_t>>{{Kind::segment_map, 20 * MiB},
                                                               {Kind::segment_map, 20 * MiB}}));
  const auto& calls = m.driver_calls().by_name();
  EXPECT_EQ(calls.at("cuMemAddressReserve"), 1u);
  EXPECT_EQ(calls.at("cuMemCreate"), 2u);
  EXPECT_EQ(calls.at("cuMemMap"), 2u);
  EXPECT_EQ(calls.at("cuMemSetAccess"), 2u);
  for (uint32_t i = 0; i < 3; ++i) m.free(i);
  m.empty_cache();  // every page unmapped, the segment's address range freed
  EXPECT_EQ(m.reserved(), 0u);
  EXPECT_EQ(calls.at("cuMemUnmap"), 2u);
  EXPECT_EQ(calls.at("cuMemRelease"), 2u);
  EXPECT_EQ(calls.at("cuMemAddressFree"), 1u);
  EXPECT_GT(m.driver_calls().seconds(), 0.0);
}

TEST(TorchExpandableModel, SmallPoolUsesTwoMiBPages) {
  TorchCachingModel m(parse_torch_conf("expandable_segments:True"), 1024 * MiB);
  ASSERT_TRUE(m.malloc(0, 1 * KiB, 0));
  EXPECT_EQ(m.reserved(), 2 * MiB);
}

TEST(TorchExpandableModel, UnmapsFreePagesToServeAnotherStream) {
  TorchCachingModel m(parse_torch_conf("expandable_segments:True"), 40 * MiB);
  ASSERT_TRUE(m.malloc(0, 40 * MiB, 1));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 40 * MiB, 2));  // stream 1's pages come back after an OOM retry
  EXPECT_EQ(m.oom_count(), 0u);
  EXPECT_EQ(m.reserved(), 40 * MiB);
}

// Random sequences: what must hold whatever the sizes.
class TorchModelProperty : public ::testing::TestWithParam<bool> {};

TEST_P(TorchModelProperty, Invariants) {
  TorchSettings s;
  s.expandable_segments = GetParam();
  std::mt19937_64 rng(42);
  for (int round = 0; round < 20; ++round) {
    TorchCachingModel m(s, kNoLimit);
    std::vector<std::pair<uint32_t, uint64_t>> live;
    uint64_t rounded_live = 0;
    for (uint32_t id = 0; id < 400; ++id) {
      if (!live.empty() && rng() % 3 == 0) {
        const size_t k = rng() % live.size();
        m.free(live[k].first);
        rounded_live -= torch_round_size(s, live[k].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        // Log-uniform sizes from 1 B to 64 MiB.
        const uint64_t size = uint64_t{1} << (rng() % 26);
        const uint64_t n = size + rng() % size;
        ASSERT_TRUE(m.malloc(id, n, rng() % 2));
        live.push_back({id, n});
        rounded_live += torch_round_size(s, n);
      }
      ASSERT_GE(m.allocated(), rounded_live);
      ASSERT_GE(m.reserved(), m.allocated());
      ASSERT_LE(m.reserved(), m.peak_reserved());
    }
    for (const auto& [id, n] : live) m.free(id);
    EXPECT_EQ(m.allocated(), 0u);
    m.empty_cache();
    EXPECT_EQ(m.reserved(), 0u) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndExpandable, TorchModelProperty, ::testing::Bool());

// A trace of random allocations: the minimum capacity found replays with no OOM, one 2 MiB
// step less does not.
TEST(TorchModelRun, MinCapacityIsTight) {
  Trace t;
  std::mt19937_64 rng(7);
  std::vector<uint32_t> live;
  uint64_t cur = 0;
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < 300; ++i) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t k = rng() % live.size();
      t.ops.push_back({TraceOp::Type::free, 0, live[k], 0});
      cur -= sizes[live[k]];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const uint64_t n = (uint64_t{1} << (10 + rng() % 16)) + rng() % 4096;
      const uint32_t b = t.blocks++;
      sizes.push_back(n);
      t.ops.push_back({TraceOp::Type::alloc, 0, b, n});
      live.push_back(b);
      cur += n;
      t.peak_live_bytes = std::max(t.peak_live_bytes, cur);
    }
  }
  t.streams = {0};
  for (bool expandable : {false, true}) {
    TorchSettings s;
    s.expandable_segments = expandable;
    TorchRunOptions o;
    const TorchRun free_run = run_torch_model(t, s, o);
    ASSERT_EQ(free_run.ooms, 0u);
    const TorchMinCapacity min = torch_min_capacity(t, s, o, free_run.peak_reserved);
    ASSERT_GE(min.bytes, t.peak_live_bytes);
    o.capacity = min.bytes;
    EXPECT_EQ(run_torch_model(t, s, o).ooms, 0u) << expandable;
    o.capacity = min.bytes - 2 * MiB;
    if (o.capacity >= t.peak_live_bytes) {
      EXPECT_GT(run_torch_model(t, s, o).ooms, 0u) << expandable;
    }
  }
}

}  // namespace
}  // namespace expanse::replay
