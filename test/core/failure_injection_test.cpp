// Invariant 4: a driver call that fails leaves the allocator consistent — no leaked handle,
// mapping or VA, the failing request gets a clear error, later requests work, data survives.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <random>

namespace expanse::test {
namespace {

using driver::EntryPoint;

struct Injection {
  EntryPoint entry;
  CUresult code;
};

class FailureInjectionTest : public CoreTest,
                             public ::testing::WithParamInterface<Injection> {};

TEST_P(FailureInjectionTest, EveryNthCallFailingLeavesAConsistentAllocator) {
  const Injection inj = GetParam();
  make(sim_config(2 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  std::mt19937_64 rng(static_cast<uint64_t>(inj.entry) * 31 + 7);
  struct Live {
    void* p;
    size_t n;
    uint64_t seed;
  };
  std::vector<Live> live;
  size_t failures = 0;
  for (uint64_t nth = 1; nth <= 40; ++nth) {
    sim::inject_failure(inj.entry, nth % 7 + 1, inj.code);
    for (int op = 0; op < 30; ++op) {
      if (live.empty() || rng() % 3 != 0) {
        size_t n = 1 + rng() % (rng() % 4 == 0 ? 300 * MiB : 3 * MiB);
        CUstream s = rng() % 2 ? s1 : s2;
        try {
          void* p = alloc_->allocate(n, s);
          fill_pattern(p, n, nth * 100 + static_cast<uint64_t>(op));
          live.push_back({p, n, nth * 100 + static_cast<uint64_t>(op)});
        } catch (const driver_failure& e) {
          ++failures;
          EXPECT_NE(std::string(e.what()).find(driver::entry_point_name(inj.entry)),
                    std::string::npos)
              << e.what();
        } catch (const out_of_memory&) {
          // Capacity reached (or cuMemCreate "ran out"): fine, as long as all stays consistent.
          ++failures;
        }
      } else {
        size_t i = rng() % live.size();
        if (rng() % 4 == 0) alloc_->record_stream(live[i].p, s2);
        try {
          alloc_->deallocate(live[i].p, s1);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        } catch (const driver_failure&) {
          ++failures;  // the block stays live and usable
        }
      }
      ASSERT_EQ(books_vs_driver(), "");
      for (const Live& b : live) ASSERT_EQ(check_pattern(b.p, b.n, b.seed), SIZE_MAX);
    }
    if (rng() % 5 == 0) {
      try {
        alloc_->release_cached();
      } catch (const driver_failure&) {
        ++failures;
      }
    }
  }
  sim::clear_injections();
  EXPECT_GT(failures, 0u) << "the injected failure never hit a request";
  // Afterwards everything works again.
  for (const Live& b : live) alloc_->deallocate(b.p, s1);
  void* p = alloc_->allocate(1 * GiB, s1);
  ASSERT_NE(p, nullptr);
  alloc_->deallocate(p, s1);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    DriverEntryPoints, FailureInjectionTest,
    ::testing::Values(Injection{EntryPoint::mem_create, CUDA_ERROR_OUT_OF_MEMORY},
                      Injection{EntryPoint::mem_create, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::mem_map, CUDA_ERROR_INVALID_VALUE},
                      Injection{EntryPoint::mem_set_access, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::mem_unmap, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::mem_release, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::mem_address_reserve, CUDA_ERROR_OUT_OF_MEMORY},
                      Injection{EntryPoint::event_record, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::event_query, CUDA_ERROR_UNKNOWN},
                      Injection{EntryPoint::event_create, CUDA_ERROR_OUT_OF_MEMORY}),
    [](const ::testing::TestParamInfo<Injection>& p) {
      return std::string(driver::entry_point_name(p.param.entry)) + "_" +
             std::to_string(static_cast<int>(p.param.code));
    });

}  // namespace
}  // namespace expanse::test

namespace expanse::test {
namespace {

// Mixed handle sizes: a block placed over part of a large free handle splits it (cuMemUnmap,
// cuMemRelease, then cuMemCreate / cuMemMap / cuMemSetAccess of finer handles). A failure at any
// call of the split leaves the books equal to the driver's, no handle or mapping leaked, the
// other blocks' data intact, and the next request works.
class SplitFailureTest : public CoreTest, public ::testing::WithParamInterface<EntryPoint> {};

TEST_P(SplitFailureTest, FailureAnywhereInASplitLeavesAConsistentAllocator) {
  size_t failures = 0;
  for (uint64_t nth = 1; nth <= 8; ++nth) {
    core::AllocatorOptions opts;
    opts.lifo_depth = 0;  // the freed block goes straight back to the free index
    make(sim_config(1 * GiB), opts);
    void* a = alloc_->allocate(256 * MiB, nullptr);  // one 128-page handle
    void* g = alloc_->allocate(3 * MiB, nullptr);
    fill_pattern(g, 3 * MiB, 7);
    alloc_->deallocate(a, nullptr);
    const core::DeviceStats before = alloc_->stats();
    sim::inject_failure(GetParam(), nth, CUDA_ERROR_UNKNOWN);
    void* b = nullptr;
    try {
      b = alloc_->allocate(100 * MiB + 512, nullptr);  // covers part of the 128-page handle
    } catch (const driver_failure& e) {
      ++failures;
      EXPECT_NE(std::string(e.what()).find(driver::entry_point_name(GetParam())),
                std::string::npos)
          << e.what();
    }
    sim::clear_injections();
    ASSERT_EQ(books_vs_driver(), "") << "nth " << nth;
    ASSERT_EQ(check_pattern(g, 3 * MiB, 7), SIZE_MAX) << "nth " << nth;
    if (b == nullptr) b = alloc_->allocate(100 * MiB + 512, nullptr);
    ASSERT_NE(b, nullptr);
    fill_pattern(b, 100 * MiB + 512, 8);
    ASSERT_EQ(check_pattern(b, 100 * MiB + 512, 8), SIZE_MAX);
    // Split (released) or, when the failure came after its unmap, still pooled.
    EXPECT_TRUE(alloc_->stats().num_released_pages > before.num_released_pages ||
                alloc_->stats().pooled_bytes > 0)
        << "the large handle was not split";
    alloc_->deallocate(b, nullptr);
    alloc_->deallocate(g, nullptr);
    alloc_->release_cached();
    EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
    TearDown();
  }
  EXPECT_GT(failures, 0u) << "the injected failure never hit the split";
}

INSTANTIATE_TEST_SUITE_P(DriverEntryPoints, SplitFailureTest,
                         ::testing::ValuesIn(split_entry_points()), entry_point_param_name);

}  // namespace
}  // namespace expanse::test
