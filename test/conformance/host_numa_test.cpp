// Host memory through the VMM API (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA), the rules
// expanse's pinned host pool relies on (cuda_vmm_spec.md, item 13 and the HOST_NUMA rows): where
// attribute 141 says so a handle is created on a host NUMA node, mapped like device memory, read
// and written by the host once a HOST_NUMA access descriptor grants it, and its pages are not the
// device's (cuMemGetInfo does not move). Where the device says no, the cases skip, saying so.
#include "conformance.hpp"

#include <sys/mman.h>

#include <cstring>

namespace expanse::conformance {
namespace {

CUmemAllocationProp host_prop(int node) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = node;
  return p;
}

CUmemAccessDesc host_access(int flags) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  d.location.id = 0;  // ignored for HOST_NUMA [DOC]
  d.flags = static_cast<CUmemAccess_flags>(flags);
  return d;
}

CUmemAccessDesc device_access(int device, int flags) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = static_cast<CUmemAccess_flags>(flags);
  return d;
}

#define REQUIRE_HOST_NUMA()                                                                      \
  do {                                                                                           \
    int vmm = 0;                                                                                 \
    ASSERT_CU(CUDA_SUCCESS,                                                                      \
              t().device_get_attribute(                                                          \
                  &vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,       \
                  dev(0)));                                                                      \
    if (vmm == 0) GTEST_SKIP() << "attribute 141 (HOST_NUMA VMM) is 0 on this device";           \
  } while (0)

// Attribute 141 and the device's host NUMA node (134) agree: a node exists where host VMM does.
TEST_P(Conformance, HostNumaAttributesAgree) {
  int vmm = 0, node = -2;
  ASSERT_CU(CUDA_SUCCESS,
            t().device_get_attribute(
                &vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev(0)));
  ASSERT_CU(CUDA_SUCCESS,
            t().device_get_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev(0)));
  EXPECT_TRUE(vmm == 0 || vmm == 1) << vmm;
  if (vmm == 1) {
    EXPECT_GE(node, 0);
  }
}

// A HOST_NUMA handle maps like device memory; with the host and the device granted, the host
// writes and reads it through the mapping, cuMemGetAccess answers both, and the device's free
// memory does not move (host pages are not the device's).
TEST_P(Conformance, HostNumaHandleMapsAndTheHostReadsAndWritesIt) {
  REQUIRE_HOST_NUMA();
  int node = 0;
  ASSERT_CU(CUDA_SUCCESS, t().device_get_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev(0)));
  const size_t free_before = mem_free();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, try_create(&h, 2 * gran(), host_prop(node < 0 ? 0 : node)));
  EXPECT_EQ(mem_free(), free_before) << "host pages counted as the device's";
  CUmemAllocationProp got{};
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
  EXPECT_EQ(static_cast<int>(got.location.type), static_cast<int>(CU_MEM_LOCATION_TYPE_HOST_NUMA));
  const CUdeviceptr va = reserve(2 * gran());
  map(va, 2 * gran(), h);
  const CUmemAccessDesc both[2] = {device_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                   host_access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  ASSERT_CU(CUDA_SUCCESS, t().mem_set_access(va, 2 * gran(), both, 2));
  unsigned char* p = host_ptr(va);
  p[0] = 0x11;
  p[2 * gran() - 1] = 0x22;
  EXPECT_EQ(p[0], 0x11);
  EXPECT_EQ(p[2 * gran() - 1], 0x22);
  CUmemLocation host{};
  host.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_access(&flags, &host, va));
  EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_EQ(get_access(va, 0), static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_CU(CUDA_SUCCESS, unmap(va, 2 * gran()));
  EXPECT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_SUCCESS, address_free(va, 2 * gran()));
  EXPECT_EQ(mem_free(), free_before);
}

// Granted to the device only, the host's access stays none.
TEST_P(Conformance, HostNumaWithoutAHostDescriptorLeavesTheHostOut) {
  REQUIRE_HOST_NUMA();
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), host_prop(0)));
  const CUdeviceptr va = reserve(gran());
  map(va, gran(), h);
  const CUmemAccessDesc d = device_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU(CUDA_SUCCESS, t().mem_set_access(va, gran(), &d, 1));
  CUmemLocation host{};
  host.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  unsigned long long flags = 7;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_access(&flags, &host, va));
  EXPECT_EQ(flags, 0u);
  EXPECT_CU(CUDA_SUCCESS, unmap(va, gran()));
  EXPECT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_SUCCESS, address_free(va, gran()));
}

// A node the host does not have is INVALID_VALUE, as -1 is [INF: the sim's answer; the real
// driver's code for a missing node is not documented].
TEST_P(Conformance, HostNumaOnANodeTheHostLacksIsInvalidValue) {
  CONFORMANCE_REQUIRE_SIM("the real driver's code for a missing node is undocumented");
  REQUIRE_HOST_NUMA();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran(), host_prop(1000)));
}

// HOST_NUMA handles are pinned host memory: not a size the granularity does not divide.
TEST_P(Conformance, HostNumaSizeNotAMultipleOfTheGranularityIsInvalidValue) {
  REQUIRE_HOST_NUMA();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, try_create(&h, gran() + 4096, host_prop(0)));
}

// cuMemHostRegister (the host pool's fallback): a range registers once; again, or overlapping,
// is HOST_MEMORY_ALREADY_REGISTERED; unregister takes its base, and anything else is
// HOST_MEMORY_NOT_REGISTERED [DOC codes].
TEST_P(Conformance, HostRegisterOnceAndUnregisterByItsBase) {
  make_current();
  const size_t bytes = 1 << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_CU(CUDA_SUCCESS, t().mem_host_register(p, bytes, CU_MEMHOSTREGISTER_PORTABLE));
  static_cast<unsigned char*>(p)[bytes - 1] = 7;
  EXPECT_CU(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, t().mem_host_register(p, bytes, 0));
  EXPECT_CU(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            t().mem_host_register(static_cast<char*>(p) + 4096, 4096, 0));
  EXPECT_CU(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
            t().mem_host_unregister(static_cast<char*>(p) + 4096));
  EXPECT_CU(CUDA_SUCCESS, t().mem_host_unregister(p));
  EXPECT_CU(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, t().mem_host_unregister(p));
  EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 7) << "the memory stays the process's";
  munmap(p, bytes);
}

// Sim: the copy engine reads HOST_NUMA pages mapped for the device, and a cuMemHostRegister
// range, directly, as it reads cuMemHostAlloc memory: an asynchronous copy from either is
// stream-ordered work that reads its source when it runs, not a staged copy made at the call.
// (Treated as pageable, a copy from pinned memory would seem to be done at once, and a host
// block reused under a running copy would go unseen.)
TEST_P(Conformance, AsyncCopiesFromHostNumaPagesAndRegisteredRangesAreStreamOrdered) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  REQUIRE_HOST_NUMA();
  make_current();
  const Block dst = make_block(1);
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  // HOST_NUMA pages mapped with access for device 0 and the host.
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), host_prop(0)));
  const CUdeviceptr va = reserve(gran());
  map(va, gran(), h);
  const CUmemAccessDesc both[2] = {device_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                   host_access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  ASSERT_CU(CUDA_SUCCESS, t().mem_set_access(va, gran(), both, 2));
  // A registered range.
  const size_t bytes = 1 << 20;
  void* reg = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(reg, MAP_FAILED);
  ASSERT_CU(CUDA_SUCCESS, t().mem_host_register(reg, bytes, CU_MEMHOSTREGISTER_PORTABLE));
  for (unsigned char* src : {host_ptr(va), static_cast<unsigned char*>(reg)}) {
    std::memset(src, 0x3a, 4096);
    hooks()->hold_stream(s);
    ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod_async(dst.ptr, src, 4096, s));
    std::memset(src, 0x4b, 4096);  // written after the call, before the copy runs
    hooks()->release_stream(s);
    ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
    EXPECT_EQ(dst.host()[0], 0x4b) << "read at the call, as a pageable source is";
    EXPECT_EQ(dst.host()[4095], 0x4b);
  }
  EXPECT_CU(CUDA_SUCCESS, t().mem_host_unregister(reg));
  munmap(reg, bytes);
  EXPECT_CU(CUDA_SUCCESS, unmap(va, gran()));
  EXPECT_CU(CUDA_SUCCESS, release(h));
  EXPECT_CU(CUDA_SUCCESS, address_free(va, gran()));
}

}  // namespace
}  // namespace expanse::conformance
