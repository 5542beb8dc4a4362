// Rules for cuMemCreate, cuMemRelease and physical memory accounting.
#include "conformance.hpp"

namespace expanse::conformance {
namespace {

// Size not a multiple of the minimum granularity → INVALID_VALUE.
TEST_P(Conformance, CreateUnalignedSizeIsInvalidValue) {
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran() + 4096, device_prop(0)));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran() / 2, device_prop(0)));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, 6912, device_prop(0)));
}

// Size 0 → INVALID_VALUE.
TEST_P(Conformance, CreateSizeZeroIsInvalidValue) {
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, 0, device_prop(0)));
}

// Flags must be 0.
TEST_P(Conformance, CreateNonZeroFlagsIsInvalidValue) {
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), device_prop(0), 1));
}

// NULL handle or NULL prop → INVALID_VALUE.
TEST_P(Conformance, CreateNullArgumentsIsInvalidValue) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(nullptr, gran(), device_prop(0)));
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = t().mem_create(&h, gran(), nullptr, 0);
  if (r == CUDA_SUCCESS) release(h);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, r);
}

// Type other than PINNED, unknown location type → INVALID_VALUE. Unknown handle-type bits
// (0x100, 0x80000000) are ignored: SUCCESS, and the handle reports them dropped (measured on H100, driver 580.159.04, 2026-11-23).
TEST_P(Conformance, CreateBadPropertiesIsInvalidValue) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop(0);
  prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
  prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
  prop = device_prop(0);
  for (const unsigned bits : {0x100u, 0x80000000u}) {
    prop = device_prop(0);
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(bits);
    h = 0;
    ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), prop));
    CUmemAllocationProp got{};
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
    EXPECT_EQ(static_cast<unsigned>(got.requestedHandleTypes), 0u) << std::hex << bits;
    EXPECT_CU(CUDA_SUCCESS, release(h));
  }
}

// DEVICE location with an ordinal out of range → INVALID_DEVICE.
TEST_P(Conformance, CreateBadDeviceIsInvalidDevice) {
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, try_create(&h, gran(), device_prop(device_count())));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, try_create(&h, gran(), device_prop(-1)));
}

// HOST_NUMA_CURRENT is not a creatable location → INVALID_VALUE.
TEST_P(Conformance, CreateHostNumaCurrentIsInvalidValue) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  prop.location.id = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
}

// gpuDirectRDMACapable=1 succeeds where attribute 110 is 1 and is NOT_SUPPORTED where it
// is 0.
TEST_P(Conformance, CreateRdmaCapableFollowsAttribute110) {
  int rdma = -1;
  ASSERT_CU(CUDA_SUCCESS, t().device_get_attribute(
                              &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev(0)));
  CUmemAllocationProp prop = device_prop(0);
  prop.allocFlags.gpuDirectRDMACapable = 1;
  CUmemGenericAllocationHandle h = 0;
  if (rdma != 0) {
    ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), prop));
    CUmemAllocationProp got;
    std::memset(&got, 0xff, sizeof got);
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
    EXPECT_EQ(got.allocFlags.gpuDirectRDMACapable, 1);
    EXPECT_CU(CUDA_SUCCESS, release(h));
  } else {
    EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, try_create(&h, gran(), prop));
  }
}

// A request larger than the device → OUT_OF_MEMORY (one call, so it is cheap on a
// real GPU too).
TEST_P(Conformance, CreateLargerThanDeviceIsOutOfMemory) {
  const size_t total = total_mem(0);
  const size_t size = (total / gran() + 1) * gran();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_create(&h, size, device_prop(0)));
}

// Filling the device exactly succeeds; one more page is OUT_OF_MEMORY; the failed
// request takes nothing; releasing makes room again; devices are independent.
TEST_P(Conformance, CreatePastCapacityIsOutOfMemory) {
  CONFORMANCE_REQUIRE_SIM("fills the whole device (capacity known: 1 GiB)");
  const CUmemGenericAllocationHandle all = create(kSimCapacity);
  EXPECT_EQ(mem_free(), 0u);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_create(&h, gran(), device_prop(0)));
  EXPECT_EQ(mem_free(), 0u);
  // The other device has its own memory.
  const CUmemGenericAllocationHandle other = create(gran(), 1);
  EXPECT_CU(CUDA_SUCCESS, release(other));
  EXPECT_CU(CUDA_SUCCESS, release(all));
  EXPECT_EQ(mem_free(), kSimCapacity);
  // Many small handles up to capacity, then OOM.
  std::vector<CUmemGenericAllocationHandle> pages;
  for (size_t i = 0; i < kSimCapacity / gran(); ++i) pages.push_back(create(gran()));
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_create(&h, gran(), device_prop(0)));
  EXPECT_CU(CUDA_SUCCESS, release(pages.back()));
  pages.pop_back();
  EXPECT_CU(CUDA_SUCCESS, try_create(&h, gran(), device_prop(0)));
  pages.push_back(h);
  for (CUmemGenericAllocationHandle p : pages) EXPECT_CU(CUDA_SUCCESS, release(p));
}

// cuMemGetInfo's free drops at cuMemCreate (not at map), and comes back when the
// last reference and the last mapping are gone.
TEST_P(Conformance, MemGetInfoTracksCreateAndLastRelease) {
  const size_t size = 3 * gran();
  const size_t before = mem_free();
  const CUmemGenericAllocationHandle h = create(size);
  const size_t after_create = mem_free();
  const CUdeviceptr p = reserve(size);
  map(p, size, h);
  ASSERT_CU(CUDA_SUCCESS, set_access(p, size));
  const size_t after_map = mem_free();
  ASSERT_CU(CUDA_SUCCESS, unmap(p, size));
  const size_t after_unmap = mem_free();
  ASSERT_CU(CUDA_SUCCESS, release(h));
  const size_t after_release = mem_free();
  if (hooks() != nullptr) {
    EXPECT_EQ(after_create, before - size);
    EXPECT_EQ(after_map, after_create);
    EXPECT_EQ(after_unmap, after_create) << "the create reference still holds the memory";
    EXPECT_EQ(after_release, before);
  } else {
    // A real GPU may be shared: only the direction is certain.
    EXPECT_LE(after_create + size, before + size / 2);
    EXPECT_GE(after_release + size / 2, after_create + size);
  }
  EXPECT_CU(CUDA_SUCCESS, address_free(p, size));
}

// Releasing while mapped succeeds; the memory lives on (readable, counted) until
// the last unmap.
TEST_P(Conformance, ReleaseWhileMappedIsDeferred) {
  const size_t before = mem_free();
  Block b = make_block(2);
  ASSERT_CU(CUDA_SUCCESS, release(b.handle));
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before - b.size) << "memory freed while still mapped";
    b.host()[0] = 7;
    b.host()[b.size - 1] = 9;
    EXPECT_EQ(b.host()[0], 7);
    EXPECT_EQ(b.host()[b.size - 1], 9);
    EXPECT_EQ(hooks()->outstanding().allocations, 1u);
  }
  // The mapping still identifies the allocation.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&again, b.ptr));
  EXPECT_EQ(again, b.handle);
  ASSERT_CU(CUDA_SUCCESS, release(again));
  ASSERT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  if (hooks() != nullptr) {
    EXPECT_EQ(mem_free(), before) << "the last unmap frees a released allocation";
    EXPECT_EQ(hooks()->outstanding().allocations, 0u);
  }
  EXPECT_CU(CUDA_SUCCESS, address_free(b.ptr, b.size));
}

// Sim policy (undefined behaviour on the real driver): releasing an unknown or already-released
// handle is INVALID_VALUE.
TEST_P(Conformance, DoubleReleaseIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("undefined behaviour on the real driver");
  const CUmemGenericAllocationHandle h = create(gran());
  EXPECT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, release(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, release(0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, release(0x1234567));
  EXPECT_EQ(mem_free(), kSimCapacity);
}

// HOST memory is not IPC-capable — requestedHandleTypes ≠ 0 → INVALID_VALUE.
TEST_P(Conformance, CreateHostWithHandleTypesIsInvalidValue) {
  CUmemAllocationProp prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
}

// HOST_NUMA with id −1 → INVALID_VALUE.
TEST_P(Conformance, CreateHostNumaWithNegativeIdIsInvalidValue) {
  CUmemAllocationProp prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = -1;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
}

// win32HandleMetaData must be NULL unless a WIN32 handle type is requested.
TEST_P(Conformance, CreateWithWin32MetadataOnLinuxIsInvalidValue) {
  CUmemAllocationProp prop = device_prop(0);
  int dummy = 0;
  prop.win32HandleMetaData = &dummy;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), prop));
}

// Physical memory is accounted per device: cuMemGetInfo under device 1's context sees
// device 1's allocations only.
TEST_P(Conformance, MemGetInfoIsPerDevice) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const size_t size = 2 * gran();
  make_current();  // device 0
  const size_t free0 = mem_free();
  CUcontext ctx1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx1, dev(1)));
  ASSERT_CU(CUDA_SUCCESS, t().ctx_push_current(ctx1));
  size_t free1 = 0;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free1, nullptr));
  const CUmemGenericAllocationHandle h = create(size, 1);
  size_t free1_after = 0;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free1_after, nullptr));
  CUcontext popped = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().ctx_pop_current(&popped));
  EXPECT_EQ(popped, ctx1);
  const size_t free0_after = mem_free();
  if (hooks() != nullptr) {
    EXPECT_EQ(free1_after, free1 - size);
    EXPECT_EQ(free0_after, free0) << "device 1's allocation was counted on device 0";
  } else {
    EXPECT_LE(free1_after + size / 2, free1);
  }
  EXPECT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
}

// Once every user-visible reference (create/retain) is released, the handle value is
// invalid even while a mapping keeps the memory alive: it cannot be mapped again or queried.
TEST_P(Conformance, ReleasedHandleIsInvalidWhileStillMapped) {
  CONFORMANCE_REQUIRE_SIM("a stale handle is undefined behaviour on the real driver");
  const Block b = make_block(1);
  ASSERT_CU(CUDA_SUCCESS, release(b.handle));
  const CUdeviceptr other = reserve(b.size);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_map(other, b.size, 0, b.handle));
  CUmemAllocationProp prop;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(&prop, b.handle));
  // Retaining through the mapping makes the (same) handle valid again.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_CU(CUDA_SUCCESS, retain(&again, b.ptr));
  EXPECT_EQ(again, b.handle);
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&prop, again));
  EXPECT_CU(CUDA_SUCCESS, try_map(other, b.size, 0, again));
}
}  // namespace
}  // namespace expanse::conformance
