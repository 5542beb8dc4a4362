// Data through mapped memory, call accounting and failure injection (docs/design.md: the sim counts
// every call, can fail the Nth call of any entry point, and backs pages with host memory).
#include "conformance.hpp"

#include "support/fault_probe.hpp"

#include <cstdint>
#include <vector>

namespace expanse::conformance {
namespace {

uint64_t pattern(uint64_t seed, size_t i) {
  uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

void fill(unsigned char* p, size_t bytes, uint64_t seed) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) w[i] = pattern(seed, i);
}

// The index of the first word that differs from the pattern, or SIZE_MAX.
size_t first_mismatch(const unsigned char* p, size_t bytes, uint64_t seed) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) {
    if (w[i] != pattern(seed, i)) return i;
  }
  return SIZE_MAX;
}

// Data written through a mapping reads back, across several pages and several handles.
TEST_P(Conformance, DataRoundTripThroughMappedMemory) {
  CONFORMANCE_REQUIRE_SIM("device memory is not host-addressable on a real GPU");
  const size_t pages = 5;
  const CUdeviceptr p = reserve(pages * gran());
  const CUmemGenericAllocationHandle a = create(2 * gran());
  const CUmemGenericAllocationHandle b = create(3 * gran());
  map(p, 2 * gran(), a);
  map(p + 2 * gran(), 3 * gran(), b);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, pages * gran()));
  unsigned char* host = host_ptr(p);
  fill(host, pages * gran(), 1);
  EXPECT_EQ(first_mismatch(host, pages * gran(), 1), SIZE_MAX);
  // The bytes belong to the handles: map them elsewhere, in the other order, and read them there.
  ASSERT_CU(CUDA_SUCCESS, unmap(p, pages * gran()));
  const CUdeviceptr q = reserve(pages * gran());
  map(q, 3 * gran(), b);
  map(q + 3 * gran(), 2 * gran(), a);
  ASSERT_CU(CUDA_SUCCESS, set_access(q, pages * gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  const unsigned char* view = host_ptr(q);
  // b held words [2*gran, 5*gran) of the pattern, a held [0, 2*gran).
  std::vector<unsigned char> expect(pages * gran());
  fill(expect.data(), expect.size(), 1);
  EXPECT_EQ(std::memcmp(view, expect.data() + 2 * gran(), 3 * gran()), 0);
  EXPECT_EQ(std::memcmp(view + 3 * gran(), expect.data(), 2 * gran()), 0);
}

// Every call counts, failing ones included, per entry point.
TEST_P(Conformance, CallCountsCountEveryCall) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's call counters");
  const unsigned long long map0 = hooks()->call_count("cuMemMap");
  const unsigned long long create0 = hooks()->call_count("cuMemCreate");
  const unsigned long long unmap0 = hooks()->call_count("cuMemUnmap");
  const unsigned long long info0 = hooks()->call_count("cuMemGetInfo");
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran(), 0, h, 1));  // a failing call counts too
  map(p, gran(), h);
  EXPECT_EQ(hooks()->call_count("cuMemCreate"), create0 + 1);
  EXPECT_EQ(hooks()->call_count("cuMemMap"), map0 + 2);
  EXPECT_EQ(hooks()->call_count("cuMemUnmap"), unmap0);
  EXPECT_EQ(hooks()->call_count("cuMemGetInfo"), info0);
  ASSERT_CU(CUDA_SUCCESS, unmap(p, gran()));
  EXPECT_EQ(hooks()->call_count("cuMemUnmap"), unmap0 + 1);
}

// An injected cuMemCreate failure returns the code, takes no memory and leaves no handle; the
// next call works.
TEST_P(Conformance, InjectedCreateFailureLeavesStateConsistent) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's failure injection");
  const size_t before = mem_free();
  const SimOutstanding o0 = hooks()->outstanding();
  hooks()->inject_failure("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);
  const CUmemGenericAllocationHandle first = create(gran());  // 1st call: works
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_create(&h, gran(), device_prop(0)));  // 2nd: injected
  EXPECT_EQ(hooks()->outstanding().allocations, o0.allocations + 1);
  EXPECT_EQ(mem_free(), before - gran());
  const CUmemGenericAllocationHandle third = create(gran());  // 3rd: works again
  EXPECT_NE(third, first);
  EXPECT_EQ(mem_free(), before - 2 * gran());
  EXPECT_CU(CUDA_SUCCESS, release(first));
  EXPECT_CU(CUDA_SUCCESS, release(third));
  EXPECT_EQ(mem_free(), before);
}

// An injected failure in the middle of map / set access / unmap changes nothing; retrying works
// and every resource can still be undone.
TEST_P(Conformance, InjectedMapFailuresLeaveStateConsistent) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's failure injection");
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle b = create(gran());

  hooks()->inject_failure("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);
  map(p, gran(), a);
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_map(p + gran(), gran(), 0, b));
  EXPECT_EQ(hooks()->outstanding().mappings, 1u);
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, retain(&got, p + gran())) << "the failed map left a mapping";
  EXPECT_CU(CUDA_SUCCESS, try_map(p + gran(), gran(), 0, b));

  hooks()->inject_failure("cuMemSetAccess", 1, CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p, 2 * gran()));
  EXPECT_EQ(get_access(p), static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
  EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p)));
  ASSERT_CU(CUDA_SUCCESS, set_access(p, 2 * gran()));
  host_ptr(p)[0] = 5;

  hooks()->inject_failure("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_CU(CUDA_ERROR_UNKNOWN, unmap(p, 2 * gran()));
  EXPECT_EQ(hooks()->outstanding().mappings, 2u);
  EXPECT_TRUE(expanse::test::probe_readable(host_ptr(p)));
  EXPECT_EQ(host_ptr(p)[0], 5);
  EXPECT_CU(CUDA_SUCCESS, unmap(p, 2 * gran()));

  hooks()->inject_failure("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_CU(CUDA_ERROR_UNKNOWN, release(a));
  EXPECT_EQ(hooks()->outstanding().allocations, 2u);
  EXPECT_CU(CUDA_SUCCESS, release(a));
  EXPECT_CU(CUDA_SUCCESS, release(b));
  EXPECT_CU(CUDA_SUCCESS, address_free(p, 2 * gran()));
  EXPECT_TRUE(hooks()->outstanding().empty()) << to_string(hooks()->outstanding());
}

}  // namespace
}  // namespace expanse::conformance
