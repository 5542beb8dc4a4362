// A workload that repeats its structure with other sizes (WorkloadShape; docs/design.md,
// "Settling on a varying workload"): it is recognised, exact repetition is not mistaken for it,
// and the fine handles made for it come at a bounded cost per allocation and never lose pages.
#include "core/placement/workload_shape.hpp"
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <random>

namespace expanse::test {
namespace {

using driver::EntryPoint;

// Each step allocates 16 large blocks scaled by a fresh factor, freeing every other one at once
// (holes of varying sizes), then frees the rest.
struct VaryingSteps {
  std::mt19937_64 rng{7};
  const size_t base[8] = {1, 2, 1, 4, 2, 1, 8, 1};
  bool vary = true;
  template <class Alloc, class Free>
  void step(Alloc&& alloc, Free&& free) {
    const size_t scale = vary ? 2 * MiB + 4096 * (rng() % 2048) : 6 * MiB;
    std::vector<void*> live;
    for (int j = 0; j < 16; ++j) {
      live.push_back(alloc(base[j % 8] * scale));
      if (j % 2 == 1) {
        free(live.back());
        live.pop_back();
      }
    }
    while (!live.empty()) {
      free(live.back());
      live.pop_back();
    }
  }
};

// The shape model alone: the same step at other sizes varies, the same step at the same sizes
// does not (the echo knows its points), and too few allocations say nothing.
TEST(WorkloadShapeTest, OtherSizesOfOneStructureVaryTheSameSizesDoNot) {
  for (bool vary : {true, false}) {
    core::WorkloadShape shape;
    std::mt19937_64 rng(3);
    const size_t base[4] = {1, 4, 2, 8};
    uint64_t n = 0;
    bool early = false;
    for (int step = 0; step < 200; ++step) {
      const size_t scale = vary ? 1 + rng() % 1000 : 100;
      for (int j = 0; j < 16; ++j) {
        const size_t sz = base[j % 4] * scale * 4096;
        // An exactly repeated step: every point known from the second on.
        shape.allocation(sz, static_cast<uint64_t>(j), !vary && step > 0);
        shape.note(sz, false);
        if (++n < core::WorkloadShape::kMoved && shape.varies()) early = true;
      }
    }
    EXPECT_FALSE(early) << "an answer before kMoved allocations";
    EXPECT_EQ(shape.varies(), vary);
  }
}

// The layers of one model: one structure at one size, many times at points the echo has not
// seen (each layer adds live blocks): never a varying workload.
TEST(WorkloadShapeTest, LayersOfOneSizeAtNewPointsDoNotVary) {
  core::WorkloadShape shape;
  const size_t base[6] = {3, 1, 1, 4, 4, 1};
  uint64_t live = 0;
  for (int layer = 0; layer < 2000; ++layer) {
    for (size_t b : base) {
      shape.allocation(b * 6 * MiB, live++, false);
      shape.note(b * 6 * MiB, false);
    }
  }
  EXPECT_FALSE(shape.varies());
}

// Once varied, for good: steps of one size after it do not make it forget (a workload that has
// varied pays for fine handles once).
TEST(WorkloadShapeTest, VariesForGood) {
  core::WorkloadShape shape;
  std::mt19937_64 rng(5);
  const size_t base[4] = {1, 4, 2, 8};
  for (int step = 0; step < 50 && !shape.varies(); ++step) {
    const size_t scale = 1 + rng() % 1000;
    for (int j = 0; j < 16; ++j) {
      shape.allocation(base[j % 4] * scale * 4096, static_cast<uint64_t>(j), false);
      shape.note(base[j % 4] * scale * 4096, false);
    }
  }
  ASSERT_TRUE(shape.varies());
  for (int step = 0; step < 1000; ++step) {
    for (int j = 0; j < 16; ++j) {
      shape.allocation(base[j % 4] * 409600, static_cast<uint64_t>(j), true);
      shape.note(base[j % 4] * 409600, false);
    }
  }
  EXPECT_TRUE(shape.varies());
}

class VaryingWorkloadTest : public CoreTest {
 protected:
  // Three small live blocks around a 1 GiB and a `cached` block, allocated while nothing says
  // the workload varies (block-sized handles), then varying steps until it does. Returns the
  // small blocks; *large gets the two large ones, still live. reserve: bytes reserved first.
  std::vector<void*> setup(CUstream& s, size_t capacity, size_t cached,
                           std::vector<void*>* large, size_t reserve = 0) {
    make(sim_config(capacity, false));
    if (reserve != 0) alloc_->reserve(reserve);
    s = new_stream();
    std::vector<void*> keep;
    keep.push_back(alloc_->allocate(2 * MiB, s));
    large->push_back(alloc_->allocate(1 * GiB, s));
    keep.push_back(alloc_->allocate(2 * MiB, s));
    large->push_back(alloc_->allocate(cached, s));
    keep.push_back(alloc_->allocate(2 * MiB, s));
    VaryingSteps w;
    auto alloc = [&](size_t n) { return alloc_->allocate(n, s); };
    auto free = [&](void* p) { alloc_->deallocate(p, s); };
    for (int i = 0; i < 150; ++i) w.step(alloc, free);
    return keep;
  }
  // Pages of the device's handles beyond their first: 0 when every handle is one page.
  static size_t pages_beyond_one_per_handle() {
    const sim::Outstanding o = sim::outstanding(0);
    return o.physical_bytes / (2 * MiB) - o.allocations;
  }
};

// Once the workload varies, new pages are one-page handles: a block's boundaries may fall
// anywhere in later steps without a split.
TEST_F(VaryingWorkloadTest, NewPagesAreOnePageOnceItVaries) {
  CUstream s = nullptr;
  std::vector<void*> large;
  std::vector<void*> keep = setup(s, 80 * GiB, 512 * MiB, &large);
  for (void* p : large) alloc_->deallocate(p, s);
  ASSERT_EQ(pages_beyond_one_per_handle(), 0u);
  const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
  void* p = alloc_->allocate(3 * GiB, s);  // beyond every page mapped so far
  EXPECT_GE(sim::call_count(EntryPoint::mem_create) - c0, 1000u);
  EXPECT_EQ(pages_beyond_one_per_handle(), 0u);
  alloc_->deallocate(p, s);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_EQ(books_vs_driver(), "");
}

// The large handles made before the workload varied are cut into pages once their blocks are
// freed, in the free's call, a bounded amount per call (40 GiB in 1 GiB handles is not cut into
// 20,480 pages inside one call): the rest at the allocations that follow, until none is left;
// then allocations that fit the mapped pages make no driver call.
TEST_F(VaryingWorkloadTest, LargeHandlesFreedAreCutABoundedAmountPerCallUntilNoneIsLeft) {
  CUstream s = nullptr;
  std::vector<void*> large;
  std::vector<void*> keep = setup(s, 80 * GiB, 40 * GiB, &large);
  ASSERT_GT(pages_beyond_one_per_handle(), 19000u) << "the test no longer sets up what it checks";
  const size_t kMostPerCall = core::PageSupply::kRefinePagesPerCall + 512;  // + one 1 GiB handle
  for (void* p : large) {
    const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
    alloc_->deallocate(p, s);
    EXPECT_GT(sim::call_count(EntryPoint::mem_create) - c0, 0u) << "no cut at the free";
    EXPECT_LE(sim::call_count(EntryPoint::mem_create) - c0, kMostPerCall);
  }
  int calls = 0;
  while (pages_beyond_one_per_handle() != 0 && calls < 100) {
    const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
    alloc_->deallocate(alloc_->allocate(4 * MiB, s), s);
    ++calls;
    EXPECT_LE(sim::call_count(EntryPoint::mem_create) - c0, kMostPerCall + 3u) << "call " << calls;
  }
  EXPECT_EQ(pages_beyond_one_per_handle(), 0u);
  EXPECT_GE(calls, 15);
  const uint64_t n0 = work_calls();
  void* p = alloc_->allocate(700 * MiB, s);
  alloc_->deallocate(p, s);
  EXPECT_EQ(work_calls() - n0, 0u);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_EQ(books_vs_driver(), "");
}

// A cuMemCreate refused (any error) while a free cuts large handles into pages loses no page:
// the free completes, the books match the driver, and every page comes back. The cut is best
// effort: a page not created again stays unmapped (free memory).
TEST_F(VaryingWorkloadTest, ARefusedCreateWhileCuttingLosesNothing) {
  uint64_t creates = 0;
  {
    CUstream s = nullptr;
    std::vector<void*> large;
    std::vector<void*> keep = setup(s, 64 * GiB, 96 * MiB, &large);
    const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
    for (void* p : large) alloc_->deallocate(p, s);
    creates = sim::call_count(EntryPoint::mem_create) - c0;
    for (void* k : keep) alloc_->deallocate(k, s);
    TearDown();
  }
  ASSERT_GT(creates, 4u);
#ifdef EXPANSE_CHECKED
  // Every call checks the books of thousands of blocks there: three refusals.
  const uint64_t stride = creates / 3 + 1;
#else
  const uint64_t stride = 1;
#endif
  for (uint64_t n = 1; n <= creates; n += stride) {
    CUstream s = nullptr;
    std::vector<void*> large;
    std::vector<void*> keep = setup(s, 64 * GiB, 96 * MiB, &large);
    sim::inject_failure(EntryPoint::mem_create, n, CUDA_ERROR_UNKNOWN);
    for (void* p : large) alloc_->deallocate(p, s);  // never throws: the cut is best effort
    sim::clear_injections();
    EXPECT_EQ(books_vs_driver(), "") << "cuMemCreate #" << n << " refused";
    EXPECT_EQ(alloc_->check_invariants(), "");
    void* p = alloc_->allocate(700 * MiB, s);  // the memory is there to be had
    alloc_->deallocate(p, s);
    for (void* k : keep) alloc_->deallocate(k, s);
    alloc_->release_cached();
    EXPECT_EQ(books_vs_driver(), "") << "after release_cached, cuMemCreate #" << n << " refused";
    TearDown();
    if (HasFailure()) return;
  }
}

// A block freed on another stream than its own waits for both (pending): its large handles are
// cut once it leaves the pending list, not left for a later step's split.
TEST_F(VaryingWorkloadTest, LargeHandlesOfABlockFreedOnAnotherStreamAreCutOnceItIsFree) {
  CUstream s = nullptr;
  std::vector<void*> large;
  std::vector<void*> keep = setup(s, 80 * GiB, 512 * MiB, &large);
  CUstream s2 = new_stream();
  const size_t before = pages_beyond_one_per_handle();
  ASSERT_GT(before, 700u);
  const uint64_t syncs = sim::call_count(EntryPoint::event_synchronize);
  for (void* p : large) alloc_->deallocate(p, s2);  // pending: s's work may still use them
  EXPECT_EQ(sim::call_count(EntryPoint::event_synchronize), syncs)
      << "a free that cannot cut anything (its block waits for s) waits for nothing";
  EXPECT_EQ(pages_beyond_one_per_handle(), before);
  // The streams' next calls record the fences they owe; an allocation that needs new pages asks
  // them, which frees the blocks; the allocations after it cut their handles, a bounded amount
  // each.
  alloc_->deallocate(alloc_->allocate(3 * MiB, s2), s2);
  alloc_->deallocate(alloc_->allocate(3 * MiB, s), s);
  alloc_->deallocate(alloc_->allocate(3 * GiB, s), s);
  for (int i = 0; i < 20 && pages_beyond_one_per_handle() != 0; ++i) {
    alloc_->deallocate(alloc_->allocate(5 * MiB + static_cast<size_t>(i) * 4096, s), s);
  }
  EXPECT_EQ(pages_beyond_one_per_handle(), 0u);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_EQ(books_vs_driver(), "");
}

// Only the default pool's large blocks take one-page handles when the workload varies: a pool
// woken after it keeps the handles any block gets (a 4 GiB block: a few, not 2,048).
TEST_F(VaryingWorkloadTest, AWakeAfterTheWorkloadVariesKeepsBlockSizedHandles) {
  CUstream s = nullptr;
  std::vector<void*> large;
  std::vector<void*> keep = setup(s, 80 * GiB, 512 * MiB, &large);
  alloc_->create_pool(7);
  void* w = alloc_->allocate(4 * GiB, s, 7);
  ASSERT_TRUE(alloc_->sleep_pool(7, core::DeviceAllocator::SleepMode::discard));
  const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
  alloc_->wake_pool(7);
  EXPECT_LE(sim::call_count(EntryPoint::mem_create) - c0, 8u);
  alloc_->deallocate(w, s);
  alloc_->release_pool(7);
  for (void* p : large) alloc_->deallocate(p, s);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_EQ(books_vs_driver(), "");
}

// Cutting releases reserved pages before it creates them again: when the driver refuses some of
// the creates, what the reservation lacks is created again at once (it never gives memory back
// while it holds it), and a refused page does not stop the pages after it.
TEST_F(VaryingWorkloadTest, ACutWithRefusedCreatesKeepsTheReservationHeld) {
  CUstream s = nullptr;
  std::vector<void*> large;
  std::vector<void*> keep = setup(s, 16 * GiB, 512 * MiB, &large, 4 * GiB);
  const uint64_t reserved = alloc_->reservation().reserved_bytes;
  ASSERT_EQ(reserved, 4 * GiB);
  ASSERT_GE(alloc_->stats().physical_bytes, reserved);
  sim::inject_failure(EntryPoint::mem_create, 1, CUDA_ERROR_UNKNOWN);
  sim::inject_failure(EntryPoint::mem_create, 2, CUDA_ERROR_UNKNOWN);
  alloc_->deallocate(large[1], s);
  sim::clear_injections();
  EXPECT_GE(alloc_->stats().physical_bytes, reserved);
  EXPECT_EQ(alloc_->check_invariants(), "");
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->deallocate(large[0], s);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_GE(alloc_->stats().physical_bytes, reserved);
}

}  // namespace
}  // namespace expanse::test
