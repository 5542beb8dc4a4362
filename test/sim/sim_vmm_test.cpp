// The VMM entry points: every documented rule with its exact code.
#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

class SimVmm : public SimTest {};

// ---- granularity
// ----------------------------------------------------------------------------------

TEST_F(SimVmm, Granularity) {
  CUmemAllocationProp p = device_prop(1);
  size_t g = 0;
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(2 * MiB, g);
  g = 0;
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(2 * MiB, g);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_granularity(
                                          &g, &p, as_enum<CUmemAllocationGranularity_flags>(2)));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().mem_get_allocation_granularity(nullptr, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().mem_get_allocation_granularity(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // The properties are not looked at (measured on H100, driver 580.159.04, 2026-11-23).
  p.location.id = 2;
  g = 0;
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(2 * MiB, g);
  p = device_prop(0);
  p.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  p = device_prop(0);
  p.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_get_allocation_granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

// ---- reserve / free
// -------------------------------------------------------------------------------

TEST_F(SimVmm, ReserveArguments) {
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(nullptr, 2 * MiB, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 0, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 4095, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 2 * MiB, 3, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 2 * MiB, 0, 0, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_reserve(&p, 2 * MiB, 0, 12345, 0));
  EXPECT_EQ(0u, outstanding().reservations);
  // Host-page multiples that are not granularity multiples are fine.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&p, 4096, 0, 0, 0));
  EXPECT_EQ(0u, p % (2 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(p, 4096));
}

TEST_F(SimVmm, ReserveAlignmentAndHint) {
  const CUdeviceptr a = reserve(6 * MiB, 1 * GiB);
  EXPECT_EQ(0u, a % GiB);
  const CUdeviceptr b = reserve(4 * MiB);
  EXPECT_EQ(0u, b % (2 * MiB));
  // A free hint is honoured: grow a right after b.
  const CUdeviceptr c = reserve(4 * MiB, 0, b + 4 * MiB);
  const bool honoured = c == b + 4 * MiB;
  // The hint can only fail if something else lives there; it never fails the call.
  EXPECT_NE(0u, c);
  // A taken hint gives another address.
  const CUdeviceptr d = reserve(2 * MiB, 0, a);
  EXPECT_NE(a, d);
  EXPECT_NE(0u, d);
  EXPECT_EQ(4u, outstanding().reservations);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 6 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(c, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(d, 2 * MiB));
#if !defined(__SANITIZE_THREAD__)  // under TSan the kernel places reservations (top-down)
  EXPECT_TRUE(honoured) << "the hint right after a fresh reservation was free";
#else
  (void)honoured;
#endif
}

TEST_F(SimVmm, ReserveExhaustion) {
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_address_reserve(&p, size_t{1} << 60, 0, 0, 0));
  EXPECT_EQ(0u, outstanding().reservations);
}

TEST_F(SimVmm, AddressFreeNeedsExactRange) {
  const CUdeviceptr a = reserve(8 * MiB);
  const CUdeviceptr b = reserve(8 * MiB, 0, a + 8 * MiB);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a + 2 * MiB, 6 * MiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 16 * MiB));  // two at once
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(0, 8 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 8 * MiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 8 * MiB));  // twice
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b, 8 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimVmm, AddressFreeWithMappings) {
  const CUdeviceptr a = reserve(4 * MiB);
  const CUmemGenericAllocationHandle h = create(2 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(a + 2 * MiB, 2 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(1u, outstanding().reservations);
  // The lenient policy unmaps implicitly.
  Policy p;
  p.free_with_mappings_is_error = false;
  set_policy(p);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(1u, outstanding().allocations);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
}

// ---- host NUMA handles
// ----------------------------------------------------------------------------

// HOST_NUMA handles: host pages counted apart from every device's (cuMemGetInfo does not move,
// Outstanding says host_numa_bytes), against sim_host_capacity together with cuMemHostAlloc's;
// nodes 0..sim_numa_nodes-1; sim_host_numa:false says attribute 141 is 0 and refuses them; no
// handle type can be asked (the sim exports no host memory).
TEST_F(SimVmm, HostNumaHandlesCountAsHostMemoryApartFromDevices) {
  SimConfig c = config();
  c.host_capacity = 8 * MiB;
  c.numa_nodes = 2;
  reset(c);
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  make_current(0);
  int attr = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_attribute(
                              &attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              dev(0)));
  EXPECT_EQ(attr, 1);
  size_t free0 = 0, total0 = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&free0, &total0));
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = 1;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&h, 4 * MiB, &p, 0));
  size_t free1 = 0, total1 = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&free1, &total1));
  EXPECT_EQ(free1, free0) << "host pages are not the device's";
  EXPECT_EQ(outstanding().host_numa_bytes, 4 * MiB);
  EXPECT_EQ(outstanding(0).physical_bytes, 0u);
  EXPECT_EQ(outstanding(0).allocations, 0u);
  CUmemGenericAllocationHandle h2 = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&h2, 6 * MiB, &p, 0)) << "beyond host capacity";
  void* pinned = nullptr;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_host_alloc(&pinned, 6 * MiB, 0))
      << "cuMemHostAlloc shares the capacity";
  p.location.id = 2;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(&h2, 2 * MiB, &p, 0)) << "no node 2";
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_create(&h2, 2 * MiB, &p, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();

  c.host_numa = false;
  reset(c);
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  make_current(0);
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_attribute(
                              &attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              dev(0)));
  EXPECT_EQ(attr, 0);
  p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(0);
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_create(&h2, 2 * MiB, &p, 0));
}

// ---- create / release
// -----------------------------------------------------------------------------

TEST_F(SimVmm, CreateArguments) {
  // A device without RDMA with VMM (attribute 110): the flag is refused.
  SimConfig no_rdma = config();
  no_rdma.rdma = false;
  reset(no_rdma);
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = device_prop(0);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(nullptr, 2 * MiB, &p, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(&h, 2 * MiB, nullptr, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(&h, 0, &p, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(&h, 3 * MiB, &p, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_create(&h, 2 * MiB, &p, 1));
  auto with = [&](auto change) {
    CUmemAllocationProp q = device_prop(0);
    change(q);
    return t().mem_create(&h, 2 * MiB, &q, 0);
  };
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            with([](CUmemAllocationProp& q) { q.type = CU_MEM_ALLOCATION_TYPE_INVALID; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            with([](CUmemAllocationProp& q) { q.type = CU_MEM_ALLOCATION_TYPE_MANAGED; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, with([](CUmemAllocationProp& q) { q.location.id = 2; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, with([](CUmemAllocationProp& q) { q.location.id = -1; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            with([](CUmemAllocationProp& q) { q.location.type = CU_MEM_LOCATION_TYPE_INVALID; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, with([](CUmemAllocationProp& q) {
              q.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
            }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, with([](CUmemAllocationProp& q) {
              q.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
              q.location.id = -1;
            }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, with([](CUmemAllocationProp& q) {
              q.location.type = CU_MEM_LOCATION_TYPE_HOST;
              q.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            }));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED,
            with([](CUmemAllocationProp& q) { q.location.type = CU_MEM_LOCATION_TYPE_HOST; }));
  // Unknown handle-type bits are ignored and dropped from the handle's properties (measured on
  // H100, driver 580.159.04, 2026-11-23).
  EXPECT_EQ(CUDA_SUCCESS, with([](CUmemAllocationProp& q) {
              q.requestedHandleTypes = as_enum<CUmemAllocationHandleType>(0x10);
            }));
  CUmemAllocationProp got{};
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
  EXPECT_EQ(0u, static_cast<unsigned>(got.requestedHandleTypes));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, with([](CUmemAllocationProp& q) {
              q.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
            }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, with([](CUmemAllocationProp& q) {
              q.win32HandleMetaData = reinterpret_cast<void*>(16);
            }));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED,
            with([](CUmemAllocationProp& q) { q.allocFlags.gpuDirectRDMACapable = 1; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            with([](CUmemAllocationProp& q) { q.allocFlags.reserved[2] = 1; }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            with([](CUmemAllocationProp& q) { q.allocFlags.usage = 0x100; }));
  EXPECT_EQ(0u, outstanding().allocations);
  // Compression is accepted and silently not granted.
  EXPECT_EQ(CUDA_SUCCESS, with([](CUmemAllocationProp& q) {
              q.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
            }));
  CUmemAllocationProp back;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&back, h));
  EXPECT_EQ(CU_MEM_ALLOCATION_COMP_NONE, back.allocFlags.compressionType);
  EXPECT_EQ(CU_MEM_LOCATION_TYPE_DEVICE, back.location.type);
  EXPECT_EQ(0, back.location.id);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(nullptr, h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_allocation_properties_from_handle(&back, h));
}

TEST_F(SimVmm, CreateOutOfMemory) {
  // 1 GiB per device: 512 pages.
  const CUmemGenericAllocationHandle big = create(1 * GiB - 2 * MiB);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp p = device_prop(0);
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&h, 4 * MiB, &p, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_create(&h, 2 * MiB, &p, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&h, 2 * MiB, &p, 0));
  // The other device has its own memory.
  const CUmemGenericAllocationHandle other = create(1 * GiB, 1);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(big));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(other));
  EXPECT_TRUE(outstanding().empty());
  EXPECT_EQ(CUDA_SUCCESS, t().mem_create(&h, 1 * GiB, &p, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
}

TEST_F(SimVmm, ReleaseRules) {
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_release(0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_release(12345));
  const CUmemGenericAllocationHandle h = create(2 * MiB);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_release(h));  // double release
  // Handle values are never reused.
  const CUmemGenericAllocationHandle h2 = create(2 * MiB);
  EXPECT_NE(h, h2);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h2));
}

TEST_F(SimVmm, ReleaseWhileMappedDefersTheFree) {
  make_current(0);
  const CUdeviceptr va = reserve(4 * MiB);
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  // The handle value is gone, the memory is not.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_release(h));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(1u, outstanding().allocations);
  size_t free_bytes = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_EQ(1 * GiB - 4 * MiB, free_bytes);
  // Retaining through the address brings the same handle value back.
  CUmemGenericAllocationHandle again = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_retain_allocation_handle(&again, as_ptr(va + 3 * MiB)));
  EXPECT_EQ(h, again);
  CUmemAllocationProp p;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&p, h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(again));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  EXPECT_EQ(0u, outstanding().allocations);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_EQ(1 * GiB, free_bytes);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 4 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

// ---- map
// ------------------------------------------------------------------------------------------

TEST_F(SimVmm, MapArguments) {
  const CUdeviceptr va = reserve(16 * MiB);
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  // Offset and size misuse is NOT_SUPPORTED, the rest INVALID_VALUE (measured on H100, driver 580.159.04, 2026-11-23).
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_map(va, 4 * MiB, 2 * MiB, h, 0));   // offset != 0
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 4 * MiB, 0, h, 1));         // flags
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va + 4096, 4 * MiB, 0, h, 0));  // unaligned ptr
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_map(va, 3 * MiB, 0, h, 0));         // unaligned size
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 0, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_map(va, 6 * MiB, 0, h, 0));  // > allocation
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_map(va, 2 * MiB, 0, h, 0));  // < allocation
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 2 * MiB, 0, 0, 0));  // no handle
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().mem_map(va + 14 * MiB, 4 * MiB, 0, h, 0));  // past the end
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 16 * MiB));
}

TEST_F(SimVmm, MapOutsideReservations) {
  const CUmemGenericAllocationHandle h = create(2 * MiB);
  const CUdeviceptr va = reserve(2 * MiB);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 2 * MiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 2 * MiB, 0, h, 0));  // freed VA
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(2 * MiB, 2 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
}

TEST_F(SimVmm, MapOverlap) {
  const CUdeviceptr va = reserve(8 * MiB);
  const CUmemGenericAllocationHandle a = create(4 * MiB);
  const CUmemGenericAllocationHandle b = create(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 4 * MiB, 0, a, 0));
  const CUmemGenericAllocationHandle c = create(2 * MiB);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va, 4 * MiB, 0, b, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va + 4 * MiB, 4 * MiB, 0, b, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(va + 2 * MiB, 2 * MiB, 0, c, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va, 2 * MiB, 0, c, 0));
  EXPECT_EQ(CUDA_SUCCESS,
            t().mem_map(va + 6 * MiB, 2 * MiB, 0, c, 0));  // aliasing: same handle twice
  EXPECT_EQ(3u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 8 * MiB));  // three whole adjacent mappings
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(c));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(a));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimVmm, MapAcrossReservations) {
  const CUdeviceptr a = reserve(4 * MiB);
  const CUdeviceptr b = reserve(4 * MiB, 0, a + 4 * MiB);
  if (b != a + 4 * MiB) {
    t().mem_address_free(a, 4 * MiB);
    t().mem_address_free(b, 4 * MiB);
    GTEST_SKIP() << "could not get two adjacent reservations (host VA layout)";
  }
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  Policy p;
  p.map_across_reservations_is_error = true;  // the strict switch
  set_policy(p);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_map(a + 2 * MiB, 4 * MiB, 0, h, 0));
  p.map_across_reservations_is_error = false;  // the default, as the real driver (measured on H100, driver 580.159.04, 2026-11-23)
  set_policy(p);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(a + 2 * MiB, 4 * MiB, 0, h, 0));
  // Freeing either reservation now is refused (live mapping), as is unmapping half of it.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(a + 2 * MiB, 2 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(a + 2 * MiB, 4 * MiB));
  // Lenient free of the second reservation unmaps the mapping that reaches into it.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(a + 2 * MiB, 4 * MiB, 0, h, 0));
  p.free_with_mappings_is_error = false;
  set_policy(p);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b, 4 * MiB));
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 4 * MiB));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
}

// ---- unmap
// ----------------------------------------------------------------------------------------

TEST_F(SimVmm, UnmapRules) {
  const CUdeviceptr va = reserve(16 * MiB);
  const CUmemGenericAllocationHandle a = create(4 * MiB);
  const CUmemGenericAllocationHandle b = create(2 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, a, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 4 * MiB, 2 * MiB, 0, b, 0));
  // A mapping cut by either end fails the call; holes and never-mapped pages are skipped
  // (measured on H100, driver 580.159.04, 2026-11-23).
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va, 2 * MiB));            // part of a
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va + 2 * MiB, 4 * MiB));  // tail of a + b
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va + 2 * MiB, 6 * MiB));  // tail, b, hole
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 6 * MiB, 2 * MiB));  // never mapped
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_unmap(va - 2 * MiB, 4 * MiB));  // starts outside
  EXPECT_EQ(2u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 4 * MiB, 4 * MiB));  // b + hole
  EXPECT_EQ(1u, outstanding().mappings);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 4 * MiB, 2 * MiB));  // twice: nothing left there
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va + 6 * MiB, 2 * MiB, 0, b, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 16 * MiB));  // a, hole, b, hole: both go
  EXPECT_EQ(0u, outstanding().mappings);
  // Re-mappable afterwards.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 2 * MiB, 0, b, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 2 * MiB, 2 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(a));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 16 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimVmm, UnmapAcrossAdjacentReservations) {
  const CUdeviceptr a = reserve(4 * MiB);
  const CUdeviceptr b = reserve(4 * MiB, 0, a + 4 * MiB);
  if (b != a + 4 * MiB) {
    t().mem_address_free(a, 4 * MiB);
    t().mem_address_free(b, 4 * MiB);
    GTEST_SKIP() << "could not get two adjacent reservations (host VA layout)";
  }
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(a, 4 * MiB, 0, h, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(b, 4 * MiB, 0, h, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(a, 8 * MiB));
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_address_free(a, 8 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_TRUE(outstanding().empty());
}

// ---- access
// ---------------------------------------------------------------------------------------

TEST_F(SimVmm, SetAccessRules) {
  const CUdeviceptr va = reserve(16 * MiB);
  const CUmemGenericAllocationHandle a = create(4 * MiB);
  const CUmemGenericAllocationHandle b = create(4 * MiB, 1);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, a, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 4 * MiB, 4 * MiB, 0, b, 0));
  CUmemAccessDesc d = access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 4 * MiB, nullptr, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 4 * MiB, &d, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 10 * MiB, &d, 1));  // hole at the end
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 2 * MiB, &d, 1));  // part of a
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().mem_set_access(va + 8 * MiB, 2 * MiB, &d, 1));  // unmapped
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va + 4096, 2 * MiB, &d, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 0, &d, 1));
  CUmemAccessDesc bad = access(0, as_enum<CUmemAccess_flags>(2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 4 * MiB, &bad, 1));
  // A bad device is INVALID_VALUE, a host location NOT_SUPPORTED (measured on H100, driver 580.159.04, 2026-11-23).
  bad = access(2, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(va, 4 * MiB, &bad, 1));
  bad = access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  bad.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().mem_set_access(va, 4 * MiB, &bad, 1));
  // Two mappings, two devices' descriptors, one call.
  const CUmemAccessDesc both[] = {access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                  access(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
  EXPECT_EQ(CUDA_SUCCESS, t().mem_set_access(va, 8 * MiB, both, 2));
  unsigned long long f = 99;
  const CUmemLocation l0 = device_location(0);
  const CUmemLocation l1 = device_location(1);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_access(&f, &l0, va + 5 * MiB));
  EXPECT_EQ(3u, f);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_access(&f, &l1, va));
  EXPECT_EQ(1u, f);
  // Part of one mapping: refused, nothing changes.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            set_access(va + 2 * MiB, 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_access(&f, &l0, va + 2 * MiB));
  EXPECT_EQ(3u, f);
  // get_access rules.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(nullptr, &l0, va));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(&f, nullptr, va));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_access(&f, &l0, va + 8 * MiB));
  const CUmemLocation l9 = device_location(9);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().mem_get_access(&f, &l9, va));
  // Unmap drops the access state.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 4 * MiB, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_map(va + 4 * MiB, 4 * MiB, 0, b, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_access(&f, &l0, va + 4 * MiB));
  EXPECT_EQ(0u, f);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 8 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(a));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 16 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimVmm, RetainAllocationHandle) {
  const CUdeviceptr va = reserve(8 * MiB);
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 4 * MiB, 0, h, 0));
  CUmemGenericAllocationHandle r = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_retain_allocation_handle(&r, as_ptr(va)));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_retain_allocation_handle(&r, as_ptr(va + 6 * MiB)));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().mem_retain_allocation_handle(nullptr, as_ptr(va + 2 * MiB)));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_retain_allocation_handle(&r, as_ptr(va + 6 * MiB - 1)));
  EXPECT_EQ(h, r);
  // NCCL's order: retain, release, unmap, release.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(r));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va + 2 * MiB, 4 * MiB));
  EXPECT_EQ(1u, outstanding().allocations);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimVmm, OutstandingAndDescription) {
  const CUdeviceptr va = reserve(8 * MiB);
  const CUmemGenericAllocationHandle h0 = create(4 * MiB, 0);
  const CUmemGenericAllocationHandle h1 = create(2 * MiB, 1);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 4 * MiB, 0, h0, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 4 * MiB, 2 * MiB, 0, h1, 0));
  Outstanding o = outstanding();
  EXPECT_EQ(1u, o.reservations);
  EXPECT_EQ(8 * MiB, o.reserved_bytes);
  EXPECT_EQ(2u, o.allocations);
  EXPECT_EQ(6 * MiB, o.physical_bytes);
  EXPECT_EQ(2u, o.mappings);
  EXPECT_EQ(6 * MiB, o.mapped_bytes);
  EXPECT_FALSE(o.empty());
  o = outstanding(1);
  EXPECT_EQ(1u, o.allocations);
  EXPECT_EQ(2 * MiB, o.physical_bytes);
  EXPECT_EQ(1u, o.mappings);
  const std::string d = describe_outstanding();
  EXPECT_NE(std::string::npos,
            d.find("1 reservations (8 MiB), 2 allocations (6 MiB), 2 mappings (6 MiB)"))
      << d;
  EXPECT_NE(std::string::npos, d.find("mapping 0x")) << d;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 6 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h1));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

}  // namespace
}  // namespace expanse::sim::testing
