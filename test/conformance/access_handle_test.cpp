// Rules for cuMemSetAccess / cuMemGetAccess and for handles:
// cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle.
#include "conformance.hpp"

#include "support/fault_probe.hpp"

namespace expanse::conformance {
namespace {

constexpr unsigned long long kNone = CU_MEM_ACCESS_FLAGS_PROT_NONE;
constexpr unsigned long long kRead = CU_MEM_ACCESS_FLAGS_PROT_READ;
constexpr unsigned long long kReadWrite = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

// The range must begin where a mapping begins and end where one ends (a
// hole at either end → INVALID_VALUE, nothing granted); a hole inside is no error: the adjacent
// mappings from the start up to the hole get the access, those past it keep theirs, SUCCESS
// (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, SetAccessOverHoleStopsAtTheHole) {
  const CUdeviceptr p = reserve(4 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle b = create(gran());
  const CUmemGenericAllocationHandle c = create(gran());
  map(p, gran(), a);
  map(p + gran(), gran(), b);
  map(p + 3 * gran(), gran(), c);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p + 2 * gran(), gran()));      // only the hole
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p, 3 * gran()));               // ends in the hole
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p + 2 * gran(), 2 * gran()));  // starts in it
  // Nothing was granted by the failed calls.
  EXPECT_EQ(get_access(p), kNone);
  EXPECT_EQ(get_access(p + gran()), kNone);
  EXPECT_EQ(get_access(p + 3 * gran()), kNone);
  EXPECT_CU(CUDA_SUCCESS, set_access(p, 4 * gran()));
  EXPECT_EQ(get_access(p), kReadWrite);
  EXPECT_EQ(get_access(p + gran()), kReadWrite);
  EXPECT_EQ(get_access(p + 3 * gran()), kNone);  // past the hole: untouched
  if (hooks() != nullptr) {
    EXPECT_TRUE(expanse::test::probe_writable(host_ptr(p + 2 * gran() - 1)));
    EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p + 3 * gran())));
  }
  // A reservation with no mapping at all.
  const CUdeviceptr empty = reserve(gran());
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(empty, gran()));
}

// A device descriptor with a bad ordinal → INVALID_VALUE (not INVALID_DEVICE;
// measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, SetAccessBadDeviceIsInvalidValue) {
  const Block b = make_block(1);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(b.ptr, b.size, device_count()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(b.ptr, b.size, -1));
  EXPECT_EQ(get_access(b.ptr), kReadWrite);
}

// Flags outside {NONE, READ, READWRITE} → INVALID_VALUE.
TEST_P(Conformance, SetAccessBadFlagsIsInvalidValue) {
  const Block b = make_block(1);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            set_access(b.ptr, b.size, 0, static_cast<CUmemAccess_flags>(0x2)));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            set_access(b.ptr, b.size, 0, static_cast<CUmemAccess_flags>(0x7)));
  EXPECT_EQ(get_access(b.ptr), kReadWrite);
}

// Count 0 or NULL descriptors → INVALID_VALUE.
TEST_P(Conformance, SetAccessCountZeroOrNullIsInvalidValue) {
  const Block b = make_block(1);
  const CUmemAccessDesc d = access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(b.ptr, b.size, &d, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(b.ptr, b.size, nullptr, 1));
  EXPECT_EQ(get_access(b.ptr), kReadWrite);
}

// Mapping grants nothing; get access is 0 before cuMemSetAccess and the granted
// flags after; the access is per device.
TEST_P(Conformance, GetAccessBeforeAndAfterSet) {
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h = create(2 * gran());
  map(p, 2 * gran(), h);
  EXPECT_EQ(get_access(p), kNone);
  EXPECT_EQ(get_access(p + gran() + 100), kNone);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, 2 * gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_EQ(get_access(p), kRead);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, 2 * gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_EQ(get_access(p + gran()), kReadWrite);
  if (device_count() > 1) {
    EXPECT_EQ(get_access(p, 1), kNone) << "granting device 0 grants nothing to device 1";
  }
  if (hooks() != nullptr) {
    EXPECT_TRUE(expanse::test::probe_writable(host_ptr(p)));
    // Revoking: PROT_NONE makes it fault again.
    ASSERT_CU(CUDA_SUCCESS, set_access(p, 2 * gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_NONE));
    EXPECT_EQ(get_access(p), kNone);
    EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p)));
  }
}

// cuMemGetAccess on an unmapped address, with NULL arguments → INVALID_VALUE; a
// bad device → INVALID_DEVICE.
TEST_P(Conformance, GetAccessMisuse) {
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  map(p, gran(), h);
  CUmemLocation loc;
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = 0;
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(&flags, &loc, p + gran()));  // reserved only
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(nullptr, &loc, p));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(&flags, nullptr, p));
  loc.id = device_count();
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().mem_get_access(&flags, &loc, p));
}

// PROT_READ makes the data readable but not writable (sim: host probes).
TEST_P(Conformance, ReadOnlyAccessIsReadableNotWritable) {
  const Block b = make_block(2);
  if (hooks() != nullptr) {
    for (size_t i = 0; i < b.size; i += 4096) b.host()[i] = static_cast<unsigned char>(i >> 12);
  }
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_EQ(get_access(b.ptr), kRead);
  if (hooks() == nullptr) return;
  for (size_t i = 0; i < b.size; i += 4096) {
    ASSERT_TRUE(expanse::test::probe_readable(b.host() + i));
    EXPECT_EQ(b.host()[i], static_cast<unsigned char>(i >> 12)) << "offset " << i;
  }
  EXPECT_FALSE(expanse::test::probe_writable(b.host()));
  EXPECT_FALSE(expanse::test::probe_writable(b.host() + b.size - 1));
}

// Unmap drops the access state; a re-map starts at PROT_NONE.
TEST_P(Conformance, UnmapDropsAccess) {
  const Block b = make_block(1);
  EXPECT_EQ(get_access(b.ptr), kReadWrite);
  ASSERT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  map(b.ptr, b.size, b.handle);
  EXPECT_EQ(get_access(b.ptr), kNone);
  if (hooks() != nullptr) {
    EXPECT_FALSE(expanse::test::probe_readable(b.host())) << "re-mapped memory is accessible";
  }
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size));
  if (hooks() != nullptr) {
    EXPECT_TRUE(expanse::test::probe_writable(b.host()));
  }
}

// Mapped but never granted memory faults (sim: host probes).
TEST_P(Conformance, MappedWithoutAccessFaults) {
  CONFORMANCE_REQUIRE_SIM("probes device pointers from the host");
  const CUdeviceptr p = reserve(gran());
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p))) << "reserved VA is readable";
  map(p, gran(), h);
  EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p))) << "mapping alone granted access";
  ASSERT_CU(CUDA_SUCCESS, set_access(p, gran()));
  EXPECT_TRUE(expanse::test::probe_writable(host_ptr(p)));
}

// One cuMemSetAccess may cover several adjacent mappings.
TEST_P(Conformance, SetAccessSpanningSeveralMappings) {
  const CUdeviceptr p = reserve(3 * gran());
  const CUmemGenericAllocationHandle a = create(gran());
  const CUmemGenericAllocationHandle b = create(2 * gran());
  map(p, gran(), a);
  map(p + gran(), 2 * gran(), b);
  EXPECT_CU(CUDA_SUCCESS, set_access(p, 3 * gran()));
  EXPECT_EQ(get_access(p), kReadWrite);
  EXPECT_EQ(get_access(p + 2 * gran()), kReadWrite);
  if (hooks() != nullptr) {
    EXPECT_TRUE(expanse::test::probe_writable(host_ptr(p)));
    EXPECT_TRUE(expanse::test::probe_writable(host_ptr(p + 3 * gran() - 1)));
  }
}

// Part of one mapping cannot get its own access: INVALID_VALUE, nothing granted (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, SetAccessOnSubRangeOfMappingIsInvalidValue) {
  const CUdeviceptr p = reserve(3 * gran());
  const CUmemGenericAllocationHandle h = create(2 * gran());
  map(p, 2 * gran(), h);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p + gran(), gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, set_access(p + gran(), 2 * gran()));  // half + a hole
  EXPECT_EQ(get_access(p), kNone);
  EXPECT_EQ(get_access(p + gran()), kNone);
  if (hooks() != nullptr) {
    EXPECT_FALSE(expanse::test::probe_readable(host_ptr(p + gran())));
  }
}

// Retain on any address inside a mapping returns the mapped handle and adds a reference
// that needs its own cuMemRelease.
TEST_P(Conformance, RetainOnInteriorAddressReturnsSameHandle) {
  const size_t before = mem_free();
  const Block b = make_block(2);
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&got, b.ptr + gran() + 123));
  EXPECT_EQ(got, b.handle);
  CUmemGenericAllocationHandle got2 = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&got2, b.ptr + b.size - 1));
  EXPECT_EQ(got2, b.handle);
  ASSERT_CU(CUDA_SUCCESS, release(got2));
  // Drop the create reference and the mapping: the retained reference still holds the memory.
  ASSERT_CU(CUDA_SUCCESS, release(b.handle));
  ASSERT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before - b.size) << "the retained reference did not hold the memory";
  }
  CUmemAllocationProp prop;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&prop, got));
  ASSERT_CU(CUDA_SUCCESS, release(got));
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before);
  }
}

// Retain on an address that is not mapped → INVALID_VALUE.
TEST_P(Conformance, RetainOnUnmappedAddressIsInvalidValue) {
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h = create(gran());
  map(p, gran(), h);
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, retain(&got, p + gran()));  // reserved, not mapped
  ASSERT_CU(CUDA_SUCCESS, unmap(p, gran()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, retain(&got, p));  // unmapped again
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, retain(nullptr, p));
}

// Properties from a handle round-trip what cuMemCreate was given.
TEST_P(Conformance, PropertiesFromHandleRoundTrip) {
  for (int d = 0; d < device_count() && d < 2; ++d) {
    const CUmemGenericAllocationHandle h = create(gran(), d);
    CUmemAllocationProp got;
    std::memset(&got, 0xab, sizeof got);
    ASSERT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
    EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    EXPECT_EQ(got.location.id, d);
    EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
    EXPECT_EQ(got.win32HandleMetaData, nullptr);
    EXPECT_EQ(got.allocFlags.compressionType, 0);
    EXPECT_EQ(got.allocFlags.gpuDirectRDMACapable, 0);
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(nullptr, h));
    EXPECT_CU(CUDA_SUCCESS, release(h));
  }
}

// Properties of a released (or never-created) handle → INVALID_VALUE.
TEST_P(Conformance, PropertiesFromReleasedHandleIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("a stale handle is undefined behaviour on the real driver");
  const CUmemGenericAllocationHandle h = create(gran());
  ASSERT_CU(CUDA_SUCCESS, release(h));
  CUmemAllocationProp got;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(&got, h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(&got, 0));
}

// HOST_NUMA or HOST access may only be given to host allocations; on device memory
// it is NOT_SUPPORTED; an INVALID or HOST_NUMA_CURRENT location is INVALID_VALUE (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, SetAccessHostNumaOnDeviceMemoryIsNotSupported) {
  const Block b = make_block(1);
  CUmemAccessDesc d = access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  d.location.id = 0;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, t().mem_set_access(b.ptr, b.size, &d, 1));
  d.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, t().mem_set_access(b.ptr, b.size, &d, 1));
  d.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(b.ptr, b.size, &d, 1));
  d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(b.ptr, b.size, &d, 1));
  EXPECT_EQ(get_access(b.ptr), kReadWrite);
}

// As in CUDA's vectorAddMMAP sample: allocations of different devices map side by side in one
// reservation, and one cuMemSetAccess with a descriptor per device covers the whole range.
TEST_P(Conformance, DevicesStripedInOneReservation) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const CUdeviceptr p = reserve(2 * gran());
  const CUmemGenericAllocationHandle h0 = create(gran(), 0);
  const CUmemGenericAllocationHandle h1 = create(gran(), 1);
  map(p, gran(), h0);
  map(p + gran(), gran(), h1);
  const CUmemAccessDesc descs[2] = {access_desc(0), access_desc(1)};
  ASSERT_CU(CUDA_SUCCESS, t().mem_set_access(p, 2 * gran(), descs, 2));
  EXPECT_EQ(get_access(p, 0), kReadWrite);
  EXPECT_EQ(get_access(p + gran(), 1), kReadWrite);
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&got, p + gran()));
  EXPECT_EQ(got, h1);
  CUmemAllocationProp prop;
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&prop, got));
  EXPECT_EQ(prop.location.id, 1);
  ASSERT_CU(CUDA_SUCCESS, release(got));
  if (hooks() != nullptr) {
    host_ptr(p)[gran() - 1] = 1;
    host_ptr(p)[gran()] = 2;
    EXPECT_EQ(host_ptr(p)[gran() - 1], 1);
    EXPECT_EQ(host_ptr(p)[gran()], 2);
  }
  EXPECT_CU(CUDA_SUCCESS, unmap(p, 2 * gran()));
}
}  // namespace
}  // namespace expanse::conformance
