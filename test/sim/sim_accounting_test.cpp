// Call counters, failure injection and the modeled driver time.
#include <stdexcept>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

using driver::EntryPoint;

class SimAccounting : public SimTest {};

TEST_F(SimAccounting, EveryCallCounts) {
  reset_counts();
  EXPECT_EQ(0u, total_calls());
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&p, 2 * MiB, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 0, 0, 0, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(p, 2 * MiB));
  const char* s = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, t().get_error_name(CUDA_SUCCESS, &s));
  EXPECT_EQ(2u, call_count(EntryPoint::mem_address_reserve));
  EXPECT_EQ(1u, call_count(EntryPoint::mem_address_free));
  EXPECT_EQ(1u, call_count(EntryPoint::get_error_name));
  EXPECT_EQ(0u, call_count(EntryPoint::mem_map));
  EXPECT_EQ(4u, total_calls());
  reset_counts();
  EXPECT_EQ(0u, total_calls());
  // reset() clears them too (SetUp's cuInit counted once).
  reset(config());
  EXPECT_EQ(0u, total_calls());
}

TEST_F(SimAccounting, InjectedFailureHasNoSideEffects) {
  inject_failure(EntryPoint::mem_create, 2, CUDA_ERROR_OUT_OF_MEMORY);
  CUmemGenericAllocationHandle a = 0;
  CUmemGenericAllocationHandle b = 0;
  CUmemGenericAllocationHandle c = 0;
  const CUmemAllocationProp prop = device_prop(0);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_create(&a, 2 * MiB, &prop, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&b, 2 * MiB, &prop, 0));
  EXPECT_EQ(0u, b);  // untouched
  EXPECT_EQ(1u, outstanding().allocations);
  EXPECT_EQ(2 * MiB, outstanding().physical_bytes);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_create(&c, 2 * MiB, &prop, 0));
  EXPECT_EQ(3u, call_count(EntryPoint::mem_create));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(a));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(c));
}

TEST_F(SimAccounting, InjectionOnMapUnmapAndSeveral) {
  const CUdeviceptr va = reserve(4 * MiB);
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  inject_failure(EntryPoint::mem_map, 1, CUDA_ERROR_OUT_OF_MEMORY);
  inject_failure(EntryPoint::mem_unmap, 1, CUDA_ERROR_UNKNOWN);
  inject_failure(EntryPoint::mem_unmap, 3, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_UNKNOWN, t().mem_unmap(va, 4 * MiB));
  EXPECT_EQ(1u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va, 4 * MiB));  // the third unmap
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  // Injection even before cuInit's check, and cleared on demand.
  inject_failure(EntryPoint::mem_release, 1, CUDA_ERROR_NOT_PERMITTED);
  clear_injections();
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 4 * MiB));
  EXPECT_TRUE(outstanding().empty());
  EXPECT_THROW(inject_failure(EntryPoint::mem_map, 0, CUDA_ERROR_UNKNOWN), std::invalid_argument);
}

TEST_F(SimAccounting, InjectionSurvivesResetCounts) {
  inject_failure(EntryPoint::device_get_count, 2, CUDA_ERROR_UNKNOWN);
  int n = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_count(&n));
  reset_counts();
  EXPECT_EQ(CUDA_ERROR_UNKNOWN, t().device_get_count(&n));
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_count(&n));
}

TEST_F(SimAccounting, ModeledTime) {
  // A table with round numbers, so the expected total can be written by hand.
  CostTable c;  // every entry point 500 ns flat
  c.set_flat(EntryPoint::mem_address_reserve, 20000);
  c.set_linear(EntryPoint::mem_create, 28000, 1000);     // + 1 us per MiB
  c.set_linear(EntryPoint::mem_map, 3000, 100);          // + 0.1 us per MiB
  c.set_linear(EntryPoint::mem_set_access, 50000, 500);  // per descriptor
  c.set_flat(EntryPoint::mem_unmap, 40000);              // per mapping (no range curve)
  c.set_flat(EntryPoint::mem_release, 20000);
  c.set_flat(EntryPoint::mem_address_free, 20000);
  c.set_flat(EntryPoint::mem_get_info, 10000);
  set_cost_table(c);
  reset_counts();
  EXPECT_EQ(0.0, modeled_seconds());
  make_current(0);  // cuDeviceGet, retain, set current: 3 x 500 ns
  const CUdeviceptr va = reserve(8 * MiB);                     // 20 us
  const CUmemGenericAllocationHandle h = create(4 * MiB);      // 28 + 4 us
  const CUmemGenericAllocationHandle h2 = create(4 * MiB);     // 28 + 4 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h, 0));  // 3 + 0.4 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 4 * MiB, 4 * MiB, 0, h2, 0));  // 3 + 0.4 us
  const CUmemAccessDesc two[] = {access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                 access(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
  // One call over two 4 MiB mappings, two descriptors: 2 x 2 x (50 + 2) us.
  ASSERT_EQ(CUDA_SUCCESS, t().mem_set_access(va, 8 * MiB, two, 2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va, 2 * MiB));  // failing: free
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 8 * MiB));              // 2 mappings x 40 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));                      // 20 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h2));                     // 20 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));       // 20 us
  size_t f = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&f, nullptr));  // 10 us
  const double expected_us = 3 * 0.5 + 20 + 2 * 32 + 2 * 3.4 + 2 * 2 * 52 + 2 * 40 + 2 * 20 +
                             20 + 10;
  EXPECT_NEAR(expected_us * 1e-6, modeled_seconds(), 1e-12);
  // A range curve replaces the per-mapping sum for ranges of several mappings.
  c.set_range_samples(EntryPoint::mem_unmap, {{1, 40000}, {2, 50000}});
  set_cost_table(c);
  const CUmemGenericAllocationHandle h3 = create(2 * MiB);
  const CUmemGenericAllocationHandle h4 = create(2 * MiB);
  const CUdeviceptr va2 = reserve(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va2, 2 * MiB, 0, h3, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va2 + 2 * MiB, 2 * MiB, 0, h4, 0));
  reset_counts();
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va2, 4 * MiB));
  EXPECT_NEAR(50e-6, modeled_seconds(), 1e-12);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h3));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h4));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va2, 4 * MiB));
  set_cost_table(CostTable::h100());
}

TEST(CostModel, LinearFitsInterpolateAndExtrapolate) {
  const CostTable& m = CostTable::h100();
  // cuMemCreate ~ 28 us + 0.24 us/MiB (published H100 figures, ovg-project/kvcached)
  EXPECT_NEAR(28480, m.cost_ns(EntryPoint::mem_create, 2 * MiB), 1e-6);
  EXPECT_NEAR(28000 + 240 * 1024, m.cost_ns(EntryPoint::mem_create, 1024 * MiB), 1e-6);
  // cuMemRelease: the two published points, and linear between them.
  EXPECT_NEAR(23000, m.cost_ns(EntryPoint::mem_release, 2 * MiB), 1e-6);
  EXPECT_NEAR(67000, m.cost_ns(EntryPoint::mem_release, 112 * MiB), 1e-6);
  EXPECT_NEAR(45000, m.cost_ns(EntryPoint::mem_release, 57 * MiB), 1e-6);
  // Without a range curve a range costs one call per mapping.
  EXPECT_NEAR(16 * m.cost_ns(EntryPoint::mem_unmap, 2 * MiB),
              m.cost_ns(EntryPoint::mem_unmap, 32 * MiB, 16), 1e-6);
  // Per call, not per byte: one 64 MiB handle is far cheaper than 32 of 2 MiB.
  EXPECT_LT(10 * m.cost_ns(EntryPoint::mem_create, 64 * MiB),
            32 * m.cost_ns(EntryPoint::mem_create, 2 * MiB));
  // Bad samples are refused with the entry point's name.
  CostTable bad;
  try {
    bad.set_samples(EntryPoint::mem_map, {{-1, 5}});
    FAIL() << "negative bytes accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cuMemMap"), std::string::npos) << e.what();
  }
}

TEST_F(SimAccounting, InjectedCallsCostNothing) {
  reset_counts();
  inject_failure(EntryPoint::mem_address_reserve, 1, CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&p, 2 * MiB, 0, 0, 0));
  EXPECT_EQ(0u, p);  // nothing was done
  EXPECT_EQ(0.0, modeled_seconds());
  EXPECT_EQ(1u, call_count(EntryPoint::mem_address_reserve));
}

// A neighbour's memory is used memory: cuMemGetInfo says so and cuMemCreate cannot have it; what
// it gives back is there again. Its hook runs after each call, under the sim's lock.
TEST_F(SimAccounting, ANeighbourTakesFreeMemoryBetweenCalls) {
  const size_t cap = config().capacity;
  const CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle a = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&a, 4 * MiB, &prop, 0));
  EXPECT_EQ(cap - 4 * MiB - 2 * MiB, neighbour_take(0, cap - 4 * MiB - 2 * MiB));
  EXPECT_EQ(2 * MiB, neighbour_take(0, 4 * MiB));  // only 2 MiB was left
  EXPECT_EQ(cap, neighbour_holds(0) + 4 * MiB);
  CUmemGenericAllocationHandle b = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&b, 2 * MiB, &prop, 0));
  // A greedy neighbour: whatever this process releases, it takes at once.
  size_t seen = 0;
  set_neighbour([&](EntryPoint e, CUresult r, Neighbour& n) {
    if (e == EntryPoint::mem_release && r == CUDA_SUCCESS) seen += n.take(0, SIZE_MAX);
  });
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(a));
  EXPECT_EQ(4 * MiB, seen);
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&b, 2 * MiB, &prop, 0));
  set_neighbour(nullptr);
  EXPECT_EQ(6 * MiB, neighbour_give(0, 6 * MiB));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&b, 6 * MiB, &prop, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b));
  EXPECT_EQ(cap - 6 * MiB, neighbour_give(0, SIZE_MAX));
  EXPECT_EQ(0u, neighbour_holds(0));
  EXPECT_THROW(neighbour_take(7, 1), std::invalid_argument);
  // reset() drops the neighbour and its memory.
  neighbour_take(0, 2 * MiB);
  reset(config());
  EXPECT_EQ(CUDA_SUCCESS, t().init(0));
  EXPECT_EQ(0u, neighbour_holds(0));
}

}  // namespace
}  // namespace expanse::sim::testing
