// Rules for cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2 (synchronous copies between host memory and a
// VMM range). The header documents the signatures and that the copies are synchronous; the codes
// for misuse are inferred: the sim answers INVALID_VALUE for a device range that is not
// wholly mapped with the access the copy needs, where the real driver may fault instead
// (CUDA_ERROR_ILLEGAL_ADDRESS, which is sticky and would poison the context for the rest of the
// suite), so those rules are sim-only.
#include "conformance.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::conformance {
namespace {

std::vector<unsigned char> bytes_pattern(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

// Data copied in with cuMemcpyHtoD reads back with cuMemcpyDtoH, across the boundary of two
// adjacent mappings of two handles (one copy spans both), and in parts.
TEST_P(Conformance, MemcpyRoundTripAcrossAdjacentMappings) {
  make_current();
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle b = create(gran());
  map(p, gran(), a);
  map(p + gran(), gran(), b);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, 2 * gran()));
  // A window straddling the boundary, at unaligned ends.
  const size_t len = 3 * 4096 + 5;
  const CUdeviceptr at = p + gran() - 2 * 4096 - 3;
  const std::vector<unsigned char> in = bytes_pattern(len, 7);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(at, in.data(), len));
  std::vector<unsigned char> out(len, 0);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(out.data(), at, len));
  EXPECT_EQ(out, in);
  // The halves read back separately, one per mapping.
  const size_t first = static_cast<size_t>(p + gran() - at);
  std::vector<unsigned char> lo(first), hi(len - first);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(lo.data(), at, lo.size()));
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(hi.data(), p + gran(), hi.size()));
  EXPECT_TRUE(std::equal(lo.begin(), lo.end(), in.begin()));
  EXPECT_TRUE(std::equal(hi.begin(), hi.end(), in.begin() + static_cast<std::ptrdiff_t>(first)));
  // The whole range in one copy each way.
  const std::vector<unsigned char> all = bytes_pattern(2 * gran(), 9);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(p, all.data(), all.size()));
  std::vector<unsigned char> back(all.size(), 0);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(back.data(), p, back.size()));
  EXPECT_EQ(back, all);
  if (hooks() != nullptr) {  // the sim: the same bytes through the host mapping
    EXPECT_EQ(std::memcmp(host_ptr(p), all.data(), all.size()), 0);
  }
}

// A DtoH whose range is not wholly mapped (a reserved hole, or running off the end of a
// mapping into one) is INVALID_VALUE and writes nothing to the host buffer.
TEST_P(Conformance, MemcpyDtoHUnmappedRangeIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("the real driver may fault (sticky ILLEGAL_ADDRESS) when unmapped");
  make_current();
  const CUdeviceptr p = reserve(3 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  map(p, gran(), h);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, gran()));
  std::vector<unsigned char> out(64, 0x5A);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(out.data(), p + gran(), out.size()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(out.data(), p + gran() - 8, 16));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().memcpy_dtoh(out.data(), p + 2 * gran() + 100, out.size()));
  for (unsigned char c : out) ASSERT_EQ(c, 0x5A) << "a failed copy wrote to the host buffer";
  // A range never reserved, and one that wraps around the address space.
  const CUdeviceptr never = reserve(gran());
  ASSERT_CU(CUDA_SUCCESS, address_free(never, gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(out.data(), never, out.size()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(out.data(), p, SIZE_MAX));
  // The mapped part alone is fine.
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(out.data(), p + gran() - 8, 8));
  // HtoD across into the hole fails the same way.
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(p + gran() - 8, out.data(), 16));
}

// HtoD needs READWRITE access for the current context's device: into a READ-only mapping (or
// one only another device may write) it is INVALID_VALUE and changes nothing; DtoH from the READ
// mapping works.
TEST_P(Conformance, MemcpyHtoDIntoReadOnlyMappingIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("the real driver may fault (sticky ILLEGAL_ADDRESS) on a read-only page");
  make_current();
  // Two handles side by side: access is given per whole mapping (part of one is INVALID_VALUE).
  Block b;
  b.size = 2 * gran();
  b.ptr = reserve(b.size);
  map(b.ptr, gran(), create(gran()));
  map(b.ptr + gran(), gran(), create(gran()));
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size));
  const std::vector<unsigned char> before = bytes_pattern(4096, 3);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr + gran() - 2048, before.data(), before.size()));
  // The second page becomes READ-only: a copy into it, or across into it, fails.
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr + gran(), gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  const std::vector<unsigned char> after = bytes_pattern(4096, 4);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(b.ptr + gran(), after.data(), 16));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().memcpy_htod(b.ptr + gran() - 2048, after.data(), after.size()));
  std::vector<unsigned char> out(before.size(), 0);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(out.data(), b.ptr + gran() - 2048, out.size()));
  EXPECT_EQ(out, before) << "a failed copy changed device memory";
  // The READWRITE first page still takes a copy.
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, after.data(), after.size()));
  // Access granted to another device only: neither copy is allowed for device 0's context.
  if (device_count() > 1) {
    ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE));
    ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(b.ptr, after.data(), 8));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(out.data(), b.ptr, 8));
  }
}

// With no current context both copies are INVALID_CONTEXT.
TEST_P(Conformance, MemcpyWithoutContextIsInvalidContext) {
  make_current();
  const Block b = make_block(1);
  std::vector<unsigned char> buf(64, 1);
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().memcpy_htod(b.ptr, buf.data(), buf.size()));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().memcpy_dtoh(buf.data(), b.ptr, buf.size()));
  make_current();
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, buf.data(), buf.size()));
}

// ByteCount 0 is a successful no-op; on the sim whatever the pointers (a NULL host pointer with
// ByteCount > 0 is INVALID_VALUE).
TEST_P(Conformance, MemcpyZeroBytesIsSuccess) {
  make_current();
  const Block b = make_block(1);
  std::vector<unsigned char> buf(8, 0x77);
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, buf.data(), 0));
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(buf.data(), b.ptr, 0));
  for (unsigned char c : buf) EXPECT_EQ(c, 0x77);
  if (hooks() != nullptr) {
    EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, nullptr, 0));
    EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(nullptr, b.ptr, 0));
    EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(buf.data(), 0, 0));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(b.ptr, nullptr, 8));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(nullptr, b.ptr, 8));
  }
}

// Before cuInit both copies are NOT_INITIALIZED.
TEST_P(Conformance, MemcpyBeforeInitIsNotInitialized) {
  CONFORMANCE_REQUIRE_SIM("needs a driver on which cuInit has not been called");
  ASSERT_NO_FATAL_FAILURE(reset_uninitialized());
  unsigned char buf[8] = {};
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().memcpy_htod(0, buf, sizeof buf));
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().memcpy_dtoh(buf, 0, sizeof buf));
}

// The copies are counted, and an injected failure returns its code without copying.
TEST_P(Conformance, MemcpyIsCountedAndInjectable) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's call counters and failure injection");
  make_current();
  const Block b = make_block(1);
  const unsigned long long h0 = hooks()->call_count("cuMemcpyHtoD");
  const unsigned long long d0 = hooks()->call_count("cuMemcpyDtoH");
  const uint64_t v = 0x0123456789ABCDEFull;
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, &v, sizeof v));
  hooks()->inject_failure("cuMemcpyHtoD", 1, CUDA_ERROR_LAUNCH_FAILED);
  const uint64_t w = 42;
  EXPECT_CU(CUDA_ERROR_LAUNCH_FAILED, t().memcpy_htod(b.ptr, &w, sizeof w));
  uint64_t got = 0;
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(&got, b.ptr, sizeof got));
  EXPECT_EQ(got, v) << "an injected failure copied";
  EXPECT_EQ(hooks()->call_count("cuMemcpyHtoD"), h0 + 2);
  EXPECT_EQ(hooks()->call_count("cuMemcpyDtoH"), d0 + 1);
}

}  // namespace
}  // namespace expanse::conformance
