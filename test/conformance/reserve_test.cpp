// Rules for cuMemGetAllocationGranularity, cuMemAddressReserve and cuMemAddressFree.
#include "conformance.hpp"

namespace expanse::conformance {
namespace {

bool is_power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Minimum granularity is a power of two (2 MiB on current GPUs and in the sim);
// recommended is a multiple of it; both work without a context.
TEST_P(Conformance, GranularityValues) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  for (int d = 0; d < device_count(); ++d) {
    const CUmemAllocationProp prop = device_prop(d);
    size_t minimum = 0;
    size_t recommended = 0;
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_granularity(&minimum, &prop,
                                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_granularity(
                                &recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    EXPECT_TRUE(is_power_of_two(minimum)) << minimum;
    EXPECT_GE(minimum, size_t{4096});
    ASSERT_GT(recommended, 0u);
    EXPECT_EQ(recommended % minimum, 0u);
    if (hooks() != nullptr) {
      EXPECT_EQ(minimum, kSimGranularity);
      EXPECT_EQ(recommended, kSimGranularity);
    }
  }
}

// Bad option, NULL output, NULL prop → INVALID_VALUE. The properties' contents are not
// looked at: a non-pinned type or a bad location type still gets the granularity (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, GranularityMisuseIsInvalidValue) {
  const CUmemAllocationProp prop = device_prop(0);
  size_t g = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            call_raw(t().mem_get_allocation_granularity, &g, &prop, 2));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().mem_get_allocation_granularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().mem_get_allocation_granularity(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t good = 0;
  ASSERT_CU(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&good, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemAllocationProp bad = prop;
  bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  g = 0;
  EXPECT_CU(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(g, good);
  bad = prop;
  bad.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  g = 0;
  EXPECT_CU(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(g, good);
}

// NULL output → INVALID_VALUE.
TEST_P(Conformance, ReserveNullPtrIsInvalidValue) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(nullptr, gran()));
}

// Size 0 → INVALID_VALUE.
TEST_P(Conformance, ReserveSizeZeroIsInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, 0));
}

// Size not a multiple of the host page size → INVALID_VALUE.
TEST_P(Conformance, ReserveUnalignedSizeIsInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, gran() + 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, 100));
}

// Alignment neither 0 nor a power of two → INVALID_VALUE.
TEST_P(Conformance, ReserveAlignmentNotPowerOfTwoIsInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, gran(), 3));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, gran(), 3 * gran()));
}

// Flags must be 0.
TEST_P(Conformance, ReserveNonZeroFlagsIsInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_reserve(&p, gran(), 0, 0, 1));
}

// The reserved address is aligned to max(alignment, granularity), and a reservation
// takes no physical memory.
TEST_P(Conformance, ReservedAddressIsAligned) {
  const size_t before = mem_free();
  const CUdeviceptr a = reserve(3 * gran());
  EXPECT_NE(a, 0u);
  EXPECT_EQ(a % gran(), 0u);
  const size_t big_align = 16 * gran();
  const CUdeviceptr b = reserve(gran(), big_align);
  EXPECT_EQ(b % big_align, 0u) << std::hex << b;
  // Reservations never overlap.
  EXPECT_TRUE(b + gran() <= a || a + 3 * gran() <= b);
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before) << "reserving took physical memory";
  }
  EXPECT_CU(CUDA_SUCCESS, address_free(a, 3 * gran()));
  EXPECT_CU(CUDA_SUCCESS, address_free(b, gran()));
}

// A free hint is honored (sim policy); a hint that is taken is not an error — the
// reservation lands elsewhere, without overlapping.
TEST_P(Conformance, ReserveHintHonoredOrMovedNeverAnError) {
  const size_t size = 4 * gran();
  const CUdeviceptr first = reserve(size);
  // Taken: must succeed somewhere else.
  CUdeviceptr moved = 0;
  ASSERT_CU(CUDA_SUCCESS, try_reserve(&moved, size, 0, first));
  EXPECT_NE(moved, first);
  EXPECT_TRUE(moved + size <= first || first + size <= moved) << "overlapping reservations";
  // Free: the same range again.
  ASSERT_CU(CUDA_SUCCESS, address_free(first, size));
  CUdeviceptr again = 0;
  ASSERT_CU(CUDA_SUCCESS, try_reserve(&again, size, 0, first));
  if (hooks() != nullptr) {
    EXPECT_EQ(again, first) << "a free hint is honored";
  }
}

// cuMemAddressFree needs the exact (ptr, size) of one reservation.
TEST_P(Conformance, AddressFreeWrongSizeIsInvalidValue) {
  const size_t size = 4 * gran();
  const CUdeviceptr p = reserve(size);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p, size + gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p, 2 * gran()));  // a prefix (sub-range)
  EXPECT_CU(CUDA_SUCCESS, address_free(p, size));
  // Freed means gone: a second free is INVALID_VALUE.
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p, size));
}

// An interior pointer (sub-range or tail) is INVALID_VALUE.
TEST_P(Conformance, AddressFreeInteriorPointerIsInvalidValue) {
  const size_t size = 4 * gran();
  const CUdeviceptr p = reserve(size);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p + gran(), gran()));       // middle
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p + gran(), size - gran()));  // tail
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(p + 4096, size));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(0, size));
  EXPECT_CU(CUDA_SUCCESS, address_free(p, size));
}

// One call covering two adjacent reservations is INVALID_VALUE; each is freed
// with its own call.
TEST_P(Conformance, AddressFreeOfTwoReservationsAtOnceIsInvalidValue) {
  const size_t half = 2 * gran();
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CONFORMANCE_RESERVE_ADJACENT(half, &a, &b);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(a, 2 * half));
  EXPECT_CU(CUDA_SUCCESS, address_free(a, half));
  EXPECT_CU(CUDA_SUCCESS, address_free(b, half));
}

// Sim policy (undefined on the real driver): freeing a reservation with a
// live mapping is INVALID_VALUE and changes nothing.
TEST_P(Conformance, AddressFreeWhileMappedIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("policy for a corner the real driver leaves undocumented");
  const Block b = make_block(2);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, address_free(b.ptr, b.size));
  // Still mapped, still accessible, still freeable after unmapping.
  EXPECT_EQ(get_access(b.ptr), static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  b.host()[0] = 42;
  EXPECT_EQ(b.host()[0], 42);
  EXPECT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  EXPECT_CU(CUDA_SUCCESS, address_free(b.ptr, b.size));
  EXPECT_CU(CUDA_SUCCESS, release(b.handle));
}

// A DEVICE location with a bad ordinal (device_count(), -1) is not checked: SUCCESS, with
// device 0's granularity (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, GranularityBadDeviceIsSuccess) {
  size_t good = 0;
  const CUmemAllocationProp prop0 = device_prop(0);
  ASSERT_CU(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&good, &prop0, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  for (const int dev : {device_count(), -1}) {
    size_t g = 0;
    const CUmemAllocationProp prop = device_prop(dev);
    EXPECT_CU(CUDA_SUCCESS,
              t().mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT_EQ(g, good) << "device " << dev;
  }
}

// A reservation larger than the address space → OUT_OF_MEMORY; one much larger than
// the device's memory is fine and takes no physical memory.
TEST_P(Conformance, ReserveBeyondAddressSpaceIsOutOfMemory) {
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_reserve(&p, size_t{1} << 52));  // 4 PiB
  const size_t before = mem_free();
  const size_t big = 16 * ((total_mem(0) / gran() + 1) * gran());
  const CUdeviceptr q = reserve(big);
  EXPECT_NE(q, 0u);
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before);
  }
  EXPECT_CU(CUDA_SUCCESS, address_free(q, big));
}
}  // namespace
}  // namespace expanse::conformance
