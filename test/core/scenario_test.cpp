// The scenarios the product exists for: a fragmented device still serves one huge contiguous
// block whenever the physical memory exists, and a repeated workload settles into zero driver
// calls.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"
#include "reference_model.hpp"

#include <random>

namespace expanse::test {
namespace {

class ScenarioTest : public CoreTest {
 protected:
  struct Live {
    void* p;
    size_t n;
    uint64_t seed;
  };

  // Allocates mixed blocks (64 MiB .. 1 GiB, plus small ones) until `fill` bytes are live, then
  // frees blocks — never two neighbours, so no hole exceeds 1 GiB — until `keep` bytes are live.
  std::vector<Live> fragment(size_t fill, size_t keep, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Live> blocks;
    size_t live = 0;
    uint64_t tag = 1;
    while (live < fill) {
      size_t n = rng() % 4 == 0 ? 512 + rng() % (256 * KiB) : 64 * MiB + rng() % (960 * MiB);
      n = std::min(n, fill - live + 512);
      void* p = alloc_->allocate(n, nullptr);
      fill_pattern(p, n, tag);
      blocks.push_back({p, n, tag++});
      live += n;
    }
    // Neighbours are neighbours in VA within one arena (small blocks have their own).
    std::vector<size_t> by_addr(blocks.size());
    for (size_t i = 0; i < by_addr.size(); ++i) by_addr[i] = i;
    std::sort(by_addr.begin(), by_addr.end(), [&](size_t x, size_t y) {
      bool sx = blocks[x].n <= MiB, sy = blocks[y].n <= MiB;
      return sx != sy ? sx : blocks[x].p < blocks[y].p;
    });
    std::vector<char> freed(blocks.size(), 0);
    std::vector<size_t> order(blocks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      if (live <= keep) break;
      // Keep both VA neighbours live so no hole is larger than one block (<= 1 GiB).
      const size_t b = by_addr[i];
      if ((i > 0 && freed[by_addr[i - 1]]) || (i + 1 < blocks.size() && freed[by_addr[i + 1]])) {
        continue;
      }
      alloc_->deallocate(blocks[b].p, nullptr);
      freed[b] = 1;
      live -= blocks[b].n;
    }
    std::vector<Live> out;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!freed[i]) out.push_back(blocks[i]);
    }
    return out;
  }

  // The largest VA gap between consecutive live blocks (within one reservation's span).
  // Small blocks (<= 1 MiB) live in an arena of their own; holes are measured among large ones.
  static size_t largest_hole(std::vector<Live> all) {
    std::vector<Live> live;
    for (const Live& b : all) {
      if (b.n > MiB) live.push_back(b);
    }
    std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.p < b.p; });
    size_t hole = 0;
    for (size_t i = 1; i < live.size(); ++i) {
      auto end = reinterpret_cast<uintptr_t>(live[i - 1].p) + (live[i - 1].n + 511) / 512 * 512;
      auto gap = reinterpret_cast<uintptr_t>(live[i].p) - end;
      if (gap < 64 * GiB) hole = std::max<size_t>(hole, gap);
    }
    return hole;
  }

  void expect_intact(const std::vector<Live>& live) {
    for (const Live& b : live) {
      ASSERT_EQ(check_pattern(b.p, b.n, b.seed), SIZE_MAX) << "block " << b.p << " lost data";
    }
  }

  void huge_block_fits(size_t fill, size_t keep, size_t want) {
    make(sim_config(80 * GiB));
    std::vector<Live> live = fragment(fill, keep, 7);
    size_t live_bytes = 0;
    for (const Live& b : live) live_bytes += b.n;
    ASSERT_GE(live_bytes, keep - GiB);
    ASSERT_LE(live_bytes, keep + GiB);
    EXPECT_LE(largest_hole(live), GiB);
    ASSERT_GT(live.size(), 40u);

    core::DeviceStats before = alloc_->stats();
    // The free memory lies in holes of at most 1 GiB; the device has no more than `want` spare
    // beyond what is mapped. The request must be served by remapping pages from the holes.
    ASSERT_LT(80 * GiB - before.mapped_bytes, want);
    void* big = alloc_->allocate(want, nullptr);
    ASSERT_NE(big, nullptr);
    core::DeviceStats after = alloc_->stats();
    EXPECT_GT(after.num_reclaimed_pages, before.num_reclaimed_pages);
    fill_pattern(big, want, 999);
    EXPECT_EQ(check_pattern(big, want, 999), SIZE_MAX);
    expect_intact(live);
    alloc_->deallocate(big, nullptr);
    for (const Live& b : live) alloc_->deallocate(b.p, nullptr);
  }
};

TEST_F(ScenarioTest, SeventeenGiBFitsWithSixtyGiBLiveInSmallHoles) {
  huge_block_fits(78 * GiB, 60 * GiB, 17 * GiB);
}

TEST_F(ScenarioTest, ThirtyTwoGiBFitsWithFortySevenGiBLiveInSmallHoles) {
  huge_block_fits(78 * GiB, 47 * GiB, 32 * GiB);
}

TEST_F(ScenarioTest, FailsOnlyWhenThePagesDoNotExist) {
  make(sim_config(8 * GiB));
  std::vector<Live> live = fragment(7 * GiB, 5 * GiB, 3);
  core::DeviceStats st = alloc_->stats();
  size_t spare = 8 * GiB - st.touched_bytes;
  // More than exists fails, and says why: a block can share its first and last page with live
  // neighbours, so spare + 2 pages + 1 byte is the least that can never fit. Exactly what exists
  // succeeds.
  try {
    alloc_->allocate(spare + 2 * alloc_->page_size() + 1, nullptr);
    ADD_FAILURE() << "allocation beyond the physical memory succeeded";
  } catch (const out_of_memory& e) {
    std::string m = e.what();
    for (const char* word : {"asked for", "capacity", "live", "cached", "reclaimable", "limit",
                             "tried", "cuMemCreate"}) {
      EXPECT_NE(m.find(word), std::string::npos) << "OOM message lacks '" << word << "': " << m;
    }
  }
  void* p = alloc_->allocate(spare, nullptr);
  ASSERT_NE(p, nullptr);
  expect_intact(live);
  alloc_->deallocate(p, nullptr);
  for (const Live& b : live) alloc_->deallocate(b.p, nullptr);
}

TEST_F(ScenarioTest, SecondReplayOfASequenceMakesNoDriverCalls) {
  make(sim_config(16 * GiB));
  CUstream s = new_stream();
  // A training-step-like sequence: weights stay, activations come and go, a workspace grows.
  std::mt19937_64 rng(99);
  std::vector<size_t> sizes;
  for (int i = 0; i < 400; ++i) sizes.push_back(512 + rng() % (rng() % 3 == 0 ? 96 * MiB : 2 * MiB));
  auto run_step = [&]() {
    std::vector<void*> acts;
    for (size_t i = 0; i < sizes.size(); ++i) {
      acts.push_back(alloc_->allocate(sizes[i], s));
      if (i % 3 == 2) {  // free some activations early, in a fixed order
        alloc_->deallocate(acts[i - 1], s);
        acts[i - 1] = nullptr;
      }
    }
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
      if (*it != nullptr) alloc_->deallocate(*it, s);
    }
  };
  run_step();
  run_step();  // warm-up: the first repeat may still settle placements
  uint64_t calls_before = work_calls();
  core::DeviceStats before = alloc_->stats();
  run_step();
  core::DeviceStats after = alloc_->stats();
  EXPECT_EQ(work_calls() - calls_before, 0u);
  EXPECT_EQ(after.total_driver_calls(), before.total_driver_calls());
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    EXPECT_EQ(after.driver_calls[static_cast<size_t>(i)], before.driver_calls[static_cast<size_t>(i)])
        << driver::entry_point_name(static_cast<driver::EntryPoint>(i));
  }
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
}

TEST_F(ScenarioTest, MappedMemoryFollowsLiveMemory) {
  // Grow to 6 GiB live, shrink to 1 GiB, grow a different shape: physical memory never exceeds
  // the device (no cache blow-up), and the new shape reuses the pages.
  make(sim_config(8 * GiB));
  std::vector<void*> a;
  for (int i = 0; i < 24; ++i) a.push_back(alloc_->allocate(256 * MiB, nullptr));
  for (int i = 4; i < 24; ++i) alloc_->deallocate(a[static_cast<size_t>(i)], nullptr);
  std::vector<void*> b;
  for (int i = 0; i < 6; ++i) b.push_back(alloc_->allocate(1 * GiB + 3 * MiB, nullptr));
  core::DeviceStats st = alloc_->stats();
  EXPECT_LE(st.physical_bytes, 8 * GiB);
  EXPECT_EQ(st.num_ooms, 0u);
  for (void* p : b) alloc_->deallocate(p, nullptr);
  for (int i = 0; i < 4; ++i) alloc_->deallocate(a[static_cast<size_t>(i)], nullptr);
}

}  // namespace
}  // namespace expanse::test

namespace expanse::test {
namespace {

// Mixed handle sizes under pressure (invariant 1): the whole device was one block's large
// handles; blocks of other shapes placed over them split the free handles into finer ones, and a
// request still succeeds whenever its pages exist, with no more physical memory than the device.
class MixedHandleTest : public CoreTest {};

TEST_F(MixedHandleTest, LargeFreeHandlesAreSplitWhereRequestsNeedThem) {
  make(sim_config(256 * MiB));
  const size_t P = alloc_->page_size();
  void* a = alloc_->allocate(128 * MiB, nullptr);  // a 64-page handle
  void* b = alloc_->allocate(126 * MiB, nullptr);  // the rest of the device, but one page
  fill_pattern(b, 126 * MiB, 1);
  const core::DeviceStats full = alloc_->stats();
  EXPECT_LT(full.driver_calls[static_cast<size_t>(driver::EntryPoint::mem_create)], 20u)
      << "254 MiB in 2 MiB handles";
  alloc_->deallocate(a, nullptr);
  // Three blocks of 40 MiB + 512 B (21 pages each) fit in the 65 pages left only by splitting
  // the free 64-page handle: no new memory exists beside it.
  std::vector<void*> v;
  for (int i = 0; i < 3; ++i) {
    void* p = alloc_->allocate(40 * MiB + 512, nullptr);
    ASSERT_NE(p, nullptr);
    fill_pattern(p, 40 * MiB + 512, 10 + static_cast<uint64_t>(i));
    v.push_back(p);
    ASSERT_EQ(alloc_->check_invariants(), "");
  }
  core::DeviceStats st = alloc_->stats();
  EXPECT_GT(st.num_released_pages, 0u) << "the large handle was never split";
  EXPECT_LE(st.physical_bytes, 256 * MiB);
  EXPECT_EQ(st.num_ooms, 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(check_pattern(v[static_cast<size_t>(i)], 40 * MiB + 512, 10 + static_cast<uint64_t>(i)),
              SIZE_MAX);
  }
  EXPECT_EQ(check_pattern(b, 126 * MiB, 1), SIZE_MAX);
  // What is left (2 pages) is exactly what invariant 1 promises.
  const size_t left = 128 - st.touched_bytes / P;
  void* c = alloc_->allocate(left * P, nullptr);
  EXPECT_NE(c, nullptr);
  EXPECT_THROW(alloc_->allocate(P, nullptr), out_of_memory);
  alloc_->deallocate(c, nullptr);
  for (void* p : v) alloc_->deallocate(p, nullptr);
  alloc_->deallocate(b, nullptr);
}

// A freed large block refilled by blocks of one smaller size (a layer's activations over its
// weights' gradient, say) splits its handle once: the rest is cut where the next blocks of that
// size will fall, so they find their handles ready. Cutting the rest as one handle split it again
// for every block (49 -> 12 | 37 -> 13 | 24 -> 12 | 12 pages): 3 unmaps, 3 releases.
TEST_F(MixedHandleTest, AFreedHandleRefilledByBlocksOfOneSizeIsSplitOnce) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  void* a = alloc_->allocate(49 * P, nullptr);  // one 49-page handle
  void* guard = alloc_->allocate(P, nullptr);   // keeps new blocks off fresh memory past a
  alloc_->deallocate(a, nullptr);
  const core::DeviceStats before = alloc_->stats();
  const size_t sz = 49 * P / 4;  // 12.25 pages: each block shares its end pages with neighbours
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {
    void* p = alloc_->allocate(sz, nullptr);
    ASSERT_NE(p, nullptr);
    fill_pattern(p, sz, 20 + static_cast<uint64_t>(i));
    v.push_back(p);
    ASSERT_EQ(alloc_->check_invariants(), "");
  }
  const core::DeviceStats st = alloc_->stats();
  const auto calls = [&](const core::DeviceStats& s, driver::EntryPoint e) {
    return s.driver_calls[static_cast<size_t>(e)];
  };
  EXPECT_EQ(static_cast<char*>(v[0]), static_cast<char*>(a)) << "the blocks did not refill a";
  EXPECT_EQ(st.physical_bytes, before.physical_bytes) << "new memory beside the freed handle";
  EXPECT_EQ(calls(st, driver::EntryPoint::mem_unmap) - calls(before, driver::EntryPoint::mem_unmap), 1u);
  EXPECT_EQ(calls(st, driver::EntryPoint::mem_release) - calls(before, driver::EntryPoint::mem_release),
            1u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(check_pattern(v[static_cast<size_t>(i)], sz, 20 + static_cast<uint64_t>(i)), SIZE_MAX);
  }
  for (void* p : v) alloc_->deallocate(p, nullptr);
  alloc_->deallocate(guard, nullptr);
}

// Reclaim first keeps physical memory at the live set: a reclaimed handle that matches no slot
// of the request exactly still serves it (the slot is cut to the handle), and pages are created
// only for the rest, instead of the reclaimed 32-page handle staying pooled beside 40 new pages.
TEST_F(MixedHandleTest, ReclaimFirstUsesReclaimedHandlesOfOtherSizes) {
  core::AllocatorOptions opts;
  opts.reclaim_before_create = true;
  opts.lifo_depth = 0;  // the freed block goes straight to the free index, where reclaim looks
  make(sim_config(1 * GiB), opts);
  const size_t P = alloc_->page_size();
  void* a = alloc_->allocate(32 * P, nullptr);  // one 32-page handle
  void* b = alloc_->allocate(P, nullptr);       // keeps a's free block from growing
  alloc_->deallocate(a, nullptr);
  void* c = alloc_->allocate(40 * P, nullptr);  // does not fit a's 32 pages: goes past b
  ASSERT_NE(c, nullptr);
  fill_pattern(c, 40 * P, 3);
  const core::DeviceStats st = alloc_->stats();
  EXPECT_GT(st.num_reclaimed_pages, 0u);
  EXPECT_EQ(st.pooled_bytes, 0u) << "a reclaimed handle was left in the pool";
  EXPECT_EQ(st.physical_bytes, st.touched_bytes) << "physical memory beyond the live set";
  EXPECT_EQ(check_pattern(c, 40 * P, 3), SIZE_MAX);
  alloc_->deallocate(c, nullptr);
  alloc_->deallocate(b, nullptr);
}

}  // namespace
}  // namespace expanse::test
