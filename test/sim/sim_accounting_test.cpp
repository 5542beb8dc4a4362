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
  reset_counts();
  EXPECT_EQ(0.0, modeled_seconds());
  make_current(0);
  const CUdeviceptr va = reserve(8 * MiB);                     // 20 us
  const CUmemGenericAllocationHandle h = create(8 * MiB);      // 4 pages * 193 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 8 * MiB, 0, h, 0));  // 4 * 1.5 us
  const CUmemAccessDesc two[] = {access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                 access(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
  ASSERT_EQ(CUDA_SUCCESS, t().mem_set_access(va, 8 * MiB, two, 2));  // 4 pages * 2 descs * 36 us
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va, 2 * MiB));   // failing: free
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 8 * MiB));               // 4 * 26 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));                       // 26 us
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));        // 20 us
  size_t f = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&f, nullptr));  // 10 us
  const CostTable a = CostTable::a100();
  const double retain_and_set =
      a.per_call_ns[static_cast<int>(EntryPoint::device_primary_ctx_retain)] +
      a.per_call_ns[static_cast<int>(EntryPoint::ctx_set_current)];
  const double expected_ns = retain_and_set + 20000 + 4 * 193000 + 4 * 1500 + 4 * 2 * 36000 +
                             4 * 26000 + 26000 + 20000 + 10000;
  EXPECT_NEAR(expected_ns * 1e-9, modeled_seconds(), 1e-12);
  // A custom table.
  CostTable flat;
  for (double& c : flat.per_call_ns) c = 1000;
  set_cost_table(flat);
  reset_counts();
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&f, nullptr));
  EXPECT_NEAR(1e-6, modeled_seconds(), 1e-15);
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

}  // namespace
}  // namespace expanse::sim::testing
