// A workload that repeats its structure with other sizes (WorkloadShape; docs/design.md,
// "Settling on a varying workload"): it is recognised, exact repetition is not mistaken for it,
// and the fine handles made for it come at a bounded cost per allocation and never lose pages.
#include "core/workload_shape.hpp"
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
        shape.allocation(static_cast<uint64_t>(j), !vary && step > 0);
        shape.note(sz, false);
        if (++n < core::WorkloadShape::kWindow && shape.varies()) early = true;
      }
    }
    EXPECT_FALSE(early) << "an answer before a window of allocations";
    EXPECT_EQ(shape.varies(), vary);
  }
}

class VaryingWorkloadTest : public CoreTest {
 protected:
  // Varying steps until the shape varies, then three small live blocks around a 1 GiB and a
  // `cached` block, both freed (cached memory in large handles). Returns the live blocks.
  std::vector<void*> setup(CUstream& s, size_t capacity, size_t cached = 512 * MiB) {
    make(sim_config(capacity, false));
    s = new_stream();
    VaryingSteps w;
    auto alloc = [&](size_t n) { return alloc_->allocate(n, s); };
    auto free = [&](void* p) { alloc_->deallocate(p, s); };
    for (int i = 0; i < 150; ++i) w.step(alloc, free);
    std::vector<void*> keep;
    keep.push_back(alloc_->allocate(2 * MiB, s));
    void* b = alloc_->allocate(1 * GiB, s);
    keep.push_back(alloc_->allocate(2 * MiB, s));
    void* c = alloc_->allocate(cached, s);
    keep.push_back(alloc_->allocate(2 * MiB, s));
    alloc_->deallocate(b, s);
    alloc_->deallocate(c, s);
    return keep;
  }
};

// One allocation that splits a handle while the workload varies refines cached memory a bounded
// amount at a time: 40 GiB cached in 1 GiB handles is not cut into 20,480 pages inside it.
TEST_F(VaryingWorkloadTest, OneSplitRefinesABoundedAmountOfCachedMemory) {
  CUstream s = nullptr;
  std::vector<void*> keep = setup(s, 80 * GiB, 40 * GiB);
  const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
  void* p = alloc_->allocate(700 * MiB, s);  // splits the 1 GiB block's handle
  const uint64_t creates = sim::call_count(EntryPoint::mem_create) - c0;
  EXPECT_LT(creates, 1000u);
  EXPECT_GT(creates, 1u) << "no split: the test no longer sets up what it checks";
  alloc_->deallocate(p, s);
  for (void* k : keep) alloc_->deallocate(k, s);
  EXPECT_EQ(books_vs_driver(), "");
}

// A cuMemCreate refused (any error) during an allocation that splits and refines loses no page:
// the allocation either succeeds or fails whole, the books match the driver, and every page
// comes back. Refinement comes after the allocation's own pages, so a refusal there is not the
// allocation's failure.
TEST_F(VaryingWorkloadTest, ARefusedCreateWhileRefiningLosesNothing) {
  uint64_t creates = 0;
  {
    CUstream s = nullptr;
    std::vector<void*> keep = setup(s, 64 * GiB, 96 * MiB);
    const uint64_t c0 = sim::call_count(EntryPoint::mem_create);
    void* p = alloc_->allocate(700 * MiB, s);
    creates = sim::call_count(EntryPoint::mem_create) - c0;
    alloc_->deallocate(p, s);
    for (void* k : keep) alloc_->deallocate(k, s);
    TearDown();
  }
  ASSERT_GT(creates, 4u);
  size_t failed = 0;
#ifdef EXPANSE_CHECKED
  // Every call checks the books of thousands of blocks there: three refusals.
  const uint64_t stride = creates / 3 + 1;
#else
  const uint64_t stride = 1;
#endif
  for (uint64_t n = 1; n <= creates; n += stride) {
    CUstream s = nullptr;
    std::vector<void*> keep = setup(s, 64 * GiB, 96 * MiB);
    sim::inject_failure(EntryPoint::mem_create, n, CUDA_ERROR_UNKNOWN);
    void* p = nullptr;
    try {
      p = alloc_->allocate(700 * MiB, s);
    } catch (const driver_failure&) {
      ++failed;  // its own pages: a clear failure, nothing changed
    }
    sim::clear_injections();
    EXPECT_EQ(books_vs_driver(), "") << "cuMemCreate #" << n << " refused";
    EXPECT_EQ(alloc_->check_invariants(), "");
    if (p != nullptr) alloc_->deallocate(p, s);
    for (void* k : keep) alloc_->deallocate(k, s);
    alloc_->release_cached();
    EXPECT_EQ(books_vs_driver(), "") << "after release_cached, cuMemCreate #" << n << " refused";
    TearDown();
    if (HasFailure()) return;
  }
  EXPECT_LT(failed, creates) << "some refusals fell in the refinement: the allocation succeeded";
}

}  // namespace
}  // namespace expanse::test
