// Rules for cuMemMap and cuMemUnmap (spec §6.6, §6.7, §7 #18-#25).
#include "conformance.hpp"

#include "support/fault_probe.hpp"

namespace expanse::conformance {
namespace {

// §6.6 / §7 #18: offset must be 0.
TEST_P(Conformance, MapNonZeroOffsetIsInvalidValue) {
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h = create(2 * gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran(), gran(), h));
  EXPECT_CU(CUDA_SUCCESS, try_map(p, 2 * gran(), 0, h));
}

// §6.6 / §7 #18: ptr and size must be multiples of the granularity.
TEST_P(Conformance, MapUnalignedPtrOrSizeIsInvalidValue) {
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p + 4096, gran(), 0, h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p + gran() / 2, gran(), 0, h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran() / 2, 0, h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, 0, 0, h));
  EXPECT_CU(CUDA_SUCCESS, try_map(p + gran(), gran(), 0, h));
}

// §6.6 / §7 #18: size larger than the allocation → INVALID_VALUE.
TEST_P(Conformance, MapSizeLargerThanAllocationIsInvalidValue) {
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, 2 * gran(), 0, h));
}

// §6.6 / §7 #18: flags must be 0.
TEST_P(Conformance, MapNonZeroFlagsIsInvalidValue) {
  const CUdeviceptr p = reserve(gran());
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran(), 0, h, 1));
}

// §6.6 / §7 #20: the range must lie inside a reservation — neither outside every reservation
// (a freed one) nor running past the end of one.
TEST_P(Conformance, MapOutsideReservationIsInvalidValue) {
  const CUmemGenericAllocationHandle h = create(2 * gran());
  const CUdeviceptr gone = reserve(2 * gran());
  ASSERT_CU(CUDA_SUCCESS, address_free(gone, 2 * gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(gone, 2 * gran(), 0, h));
  const CUdeviceptr p = reserve(3 * gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p + 2 * gran(), 2 * gran(), 0, h));  // tail overhangs
  EXPECT_CU(CUDA_SUCCESS, try_map(p + gran(), 2 * gran(), 0, h));
}

// §6.6 / §7 #19: mapping over an existing mapping (whole or partly) → INVALID_VALUE.
TEST_P(Conformance, MapOverExistingMappingIsInvalidValue) {
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle a = create(2 * gran());
  const CUmemGenericAllocationHandle b = create(2 * gran());
  map(p + gran(), 2 * gran(), a);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p + gran(), 2 * gran(), 0, b));  // same range
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, 2 * gran(), 0, b));           // overlaps head
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p + 2 * gran(), 2 * gran(), 0, b));  // overlaps tail
  // The first mapping is intact.
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&got, p + gran()));
  EXPECT_EQ(got, a);
  EXPECT_CU(CUDA_SUCCESS, release(got));
  if (hooks() != nullptr) {
    EXPECT_EQ(hooks()->outstanding().mappings, 1u);
  }
}

// §6.6 / §7 #21 / §10 (sim policy; undocumented on the real driver): one mapping may not span two
// adjacent reservations.
TEST_P(Conformance, MapSpanningTwoReservationsIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("policy for a corner the real driver leaves undocumented (spec §10)");
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CONFORMANCE_RESERVE_ADJACENT(2 * gran(), &a, &b);
  const CUmemGenericAllocationHandle h = create(2 * gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(a + gran(), 2 * gran(), 0, h));
  EXPECT_CU(CUDA_SUCCESS, try_map(b, 2 * gran(), 0, h));
}

// §6.6: an unknown handle, or one whose every reference is gone → INVALID_VALUE.
TEST_P(Conformance, MapReleasedHandleIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("a stale handle is undefined behaviour on the real driver");
  const CUdeviceptr p = reserve(gran());
  const CUmemGenericAllocationHandle h = create(gran());
  ASSERT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran(), 0, h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(p, gran(), 0, 0));
}

// §6.6 / §7 #22: one handle mapped at two VAs; both views show the same bytes.
TEST_P(Conformance, MapSameHandleAtTwoAddressesSharesData) {
  const size_t size = 2 * gran();
  const CUdeviceptr p = reserve(size);
  const CUdeviceptr q = reserve(size);
  const CUmemGenericAllocationHandle h = create(size);
  EXPECT_CU(CUDA_SUCCESS, try_map(p, size, 0, h));
  EXPECT_CU(CUDA_SUCCESS, try_map(q, size, 0, h));
  ASSERT_CU(CUDA_SUCCESS, set_access(p, size));
  ASSERT_CU(CUDA_SUCCESS, set_access(q, size));
  // Two mappings plus the create reference: release + one unmap keep the memory alive.
  ASSERT_CU(CUDA_SUCCESS, release(h));
  ASSERT_CU(CUDA_SUCCESS, unmap(q, size));
  // The mapping at p keeps the handle valid: retain it there and map it at q again.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&again, p));
  EXPECT_EQ(again, h);
  ASSERT_CU(CUDA_SUCCESS, try_map(q, size, 0, again));
  ASSERT_CU(CUDA_SUCCESS, set_access(q, size));
  if (hooks() == nullptr) return;  // the rest reads device memory from the host
  unsigned char* a = host_ptr(p);
  unsigned char* b = host_ptr(q);
  a[0] = 0x11;
  a[size - 1] = 0x22;
  b[gran()] = 0x33;
  EXPECT_EQ(b[0], 0x11);
  EXPECT_EQ(b[size - 1], 0x22);
  EXPECT_EQ(a[gran()], 0x33);
}

// §6.7 / §7 #23: unmapping part of one mapping → INVALID_VALUE, and the mapping is untouched.
TEST_P(Conformance, UnmapSubRangeIsInvalidValue) {
  const Block b = make_block(2);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(b.ptr, gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(b.ptr + gran(), gran()));
  EXPECT_EQ(get_access(b.ptr + gran()),
            static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  if (hooks() != nullptr) {
    EXPECT_TRUE(expanse::test::probe_writable(b.host()));
    EXPECT_TRUE(expanse::test::probe_writable(b.host() + b.size - 1));
  }
  EXPECT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
}

// §6.7 / §7 #25: a range containing a never-mapped page → INVALID_VALUE (nothing unmapped).
TEST_P(Conformance, UnmapOverHoleIsInvalidValue) {
  const CUdeviceptr p = reserve(3 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle c = create(gran());
  map(p, gran(), a);
  map(p + 2 * gran(), gran(), c);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(p, 3 * gran()));       // hole in the middle
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(p + gran(), gran()));  // only the hole
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(p, 2 * gran()));       // mapping + hole
  if (hooks() != nullptr) {
    EXPECT_EQ(hooks()->outstanding().mappings, 2u);
  }
  EXPECT_CU(CUDA_SUCCESS, unmap(p, gran()));
  EXPECT_CU(CUDA_SUCCESS, unmap(p + 2 * gran(), gran()));
}

// §6.7 / §7 #24: one unmap may cover several whole adjacent mappings.
TEST_P(Conformance, UnmapSpanningAdjacentMappingsSucceeds) {
  const size_t before = mem_free();
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle b = create(2 * gran());
  const CUmemGenericAllocationHandle c = create(gran());
  map(p, gran(), a);
  map(p + gran(), 2 * gran(), b);
  map(p + 3 * gran(), gran(), c);
  ASSERT_CU(CUDA_SUCCESS, release(a));
  ASSERT_CU(CUDA_SUCCESS, release(b));
  ASSERT_CU(CUDA_SUCCESS, release(c));
  EXPECT_CU(CUDA_SUCCESS, unmap(p, 4 * gran()));
  if (hooks() != nullptr) {
    EXPECT_EQ(hooks()->outstanding().mappings, 0u);
    EXPECT_EQ(mem_free(), before);
  }
  // The range is plain reservation again: re-mappable.
  const CUmemGenericAllocationHandle d = create(4 * gran());
  EXPECT_CU(CUDA_SUCCESS, try_map(p, 4 * gran(), 0, d));
}

// §6.7 / §7 #24 / §8.7: one unmap may cover whole mappings in two adjacent reservations, which
// are still freed one by one.
TEST_P(Conformance, UnmapAcrossAdjacentReservationsSucceeds) {
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CONFORMANCE_RESERVE_ADJACENT(2 * gran(), &a, &b);
  const CUmemGenericAllocationHandle h1 = create(2 * gran());
  const CUmemGenericAllocationHandle h2 = create(2 * gran());
  map(a, 2 * gran(), h1);
  map(b, 2 * gran(), h2);
  EXPECT_CU(CUDA_SUCCESS, unmap(a, 4 * gran()));
  if (hooks() != nullptr) {
    EXPECT_EQ(hooks()->outstanding().mappings, 0u);
  }
  EXPECT_CU(CUDA_SUCCESS, address_free(a, 2 * gran()));
  EXPECT_CU(CUDA_SUCCESS, address_free(b, 2 * gran()));
}

// §6.7: after unmap the pages fault again (sim: host access is the observable).
TEST_P(Conformance, UnmappedMemoryFaults) {
  CONFORMANCE_REQUIRE_SIM("probes device pointers from the host");
  const Block b = make_block(1);
  EXPECT_TRUE(expanse::test::probe_writable(b.host()));
  ASSERT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  EXPECT_FALSE(expanse::test::probe_readable(b.host()));
  EXPECT_FALSE(expanse::test::probe_readable(b.host() + b.size - 1));
}

// §6.7: unmap of a range that was never mapped, or of an address outside any reservation →
// INVALID_VALUE.
TEST_P(Conformance, UnmapNeverMappedIsInvalidValue) {
  const CUdeviceptr p = reserve(2 * gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(p, 2 * gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, unmap(p, 0));
}

}  // namespace
}  // namespace expanse::conformance
