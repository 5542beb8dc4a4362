// Host memory behind the pages: data, aliasing, faults, RAM given back, no-backing mode.
#include <cstring>
#include <vector>

#include "sim_test_util.hpp"
#include "support/fault_probe.hpp"

namespace expanse::sim::testing {
namespace {

using expanse::test::probe_readable;
using expanse::test::probe_writable;

class SimData : public SimTest {};

TEST_F(SimData, WriteAndReadBack) {
  const Buffer b = make_buffer(8 * MiB);
  auto* p = as_ptr<unsigned char>(b.va);
  std::memset(p, 0xAB, b.size);
  for (size_t i = 0; i < b.size; i += 4096) ASSERT_EQ(0xAB, p[i]);
  free_buffer(b);
}

TEST_F(SimData, TwoMappingsOfOneHandleShareBytes) {
  const CUdeviceptr a = reserve(4 * MiB);
  const CUdeviceptr b = reserve(4 * MiB);
  const CUmemGenericAllocationHandle h = create(4 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(a, 4 * MiB, 0, h, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(b, 4 * MiB, 0, h, 0));
  ASSERT_EQ(CUDA_SUCCESS, set_access(a, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  ASSERT_EQ(CUDA_SUCCESS, set_access(b, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  auto* pa = as_ptr<uint64_t>(a);
  const auto* pb = as_ptr<const uint64_t>(b);
  const size_t n = 4 * MiB / sizeof(uint64_t);
  for (size_t i = 0; i < n; i += 512) pa[i] = 0x1234567800000000ull + i;
  for (size_t i = 0; i < n; i += 512) ASSERT_EQ(0x1234567800000000ull + i, pb[i]);
  // Release the handle: the mappings keep the bytes alive.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(a, 4 * MiB));
  EXPECT_EQ(0x1234567800000000ull, pb[0]);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(b, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(a, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b, 4 * MiB));
  EXPECT_TRUE(outstanding().empty());
}

TEST_F(SimData, DataFollowsTheHandleAcrossRemaps) {
  const CUdeviceptr va = reserve(4 * MiB);
  const CUmemGenericAllocationHandle h0 = create(2 * MiB);
  const CUmemGenericAllocationHandle h1 = create(2 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 2 * MiB, 0, h0, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 2 * MiB, 0, h1, 0));
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  as_ptr<int>(va)[0] = 100;
  as_ptr<int>(va + 2 * MiB)[0] = 101;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  // Swap them.
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 2 * MiB, 0, h1, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 2 * MiB, 0, h0, 0));
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_EQ(101, as_ptr<int>(va)[0]);
  EXPECT_EQ(100, as_ptr<int>(va + 2 * MiB)[0]);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h1));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 4 * MiB));
}

TEST_F(SimData, AccessFaultsUnlessGranted) {
  const CUdeviceptr va = reserve(8 * MiB);
  void* p = as_ptr(va);
  void* q = as_ptr(va + 2 * MiB + 100);
  EXPECT_FALSE(probe_readable(p));  // reserved only
  // Two handles: access is given per whole mapping.
  const CUmemGenericAllocationHandle h = create(2 * MiB);
  const CUmemGenericAllocationHandle h2 = create(2 * MiB);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 2 * MiB, 0, h, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + 2 * MiB, 2 * MiB, 0, h2, 0));
  EXPECT_FALSE(probe_readable(p));  // mapped, no access yet
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_TRUE(probe_readable(p));
  EXPECT_FALSE(probe_writable(p));
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_TRUE(probe_writable(p));
  EXPECT_TRUE(probe_writable(q));
  EXPECT_FALSE(probe_readable(as_ptr(va + 4 * MiB)));  // past the mapping
  // Revoke the second page only.
  ASSERT_EQ(CUDA_SUCCESS, set_access(va + 2 * MiB, 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE));
  EXPECT_TRUE(probe_writable(p));
  EXPECT_FALSE(probe_readable(q));
  // Access granted to another device only: the host stands for every device, so it can read.
  ASSERT_EQ(CUDA_SUCCESS, set_access(va + 2 * MiB, 2 * MiB, 1, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_TRUE(probe_readable(q));
  EXPECT_FALSE(probe_writable(q));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 4 * MiB));
  EXPECT_FALSE(probe_readable(p));  // unmapped again
  // Remapped: access is not inherited.
  ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, 2 * MiB, 0, h, 0));
  EXPECT_FALSE(probe_readable(p));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, 2 * MiB));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h2));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 8 * MiB));
}

TEST_F(SimData, ReleaseReturnsRam) {
  ASSERT_EQ(0u, resident_bytes());
  const Buffer b = make_buffer(64 * MiB);
  std::memset(as_ptr(b.va), 0x5A, b.size);
  EXPECT_GE(resident_bytes(0), 64 * MiB);
  EXPECT_EQ(0u, resident_bytes(1));
  // Released while mapped: still there.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b.handle));
  EXPECT_GE(resident_bytes(), 64 * MiB);
  EXPECT_EQ(0x5A, as_ptr<unsigned char>(b.va)[b.size - 1]);
  // The last unmap frees it and the RAM goes back to the OS.
  EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(b.va, b.size));
  EXPECT_EQ(0u, resident_bytes());
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b.va, b.size));
  // A new allocation reuses the extent and starts zeroed.
  const Buffer c = make_buffer(64 * MiB);
  EXPECT_EQ(0, as_ptr<unsigned char>(c.va)[0]);
  EXPECT_EQ(0, as_ptr<unsigned char>(c.va)[c.size - 1]);
  free_buffer(c);
  EXPECT_EQ(0u, resident_bytes());
}

TEST_F(SimData, ManyHandlesFewHostMappings) {
  // 256 handles mapped in order: the memfd extents are adjacent, so the host merges them.
  const size_t n = 256;
  const size_t before = host_mapping_count();
  const CUdeviceptr va = reserve(n * 2 * MiB);
  std::vector<CUmemGenericAllocationHandle> hs(n);
  for (size_t i = 0; i < n; ++i) {
    hs[i] = create(2 * MiB);
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + i * 2 * MiB, 2 * MiB, 0, hs[i], 0));
  }
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, n * 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  // (Slack for the test's own heap: malloc/ASan map memory too.)
  EXPECT_LT(host_mapping_count(), before + 64);
  for (size_t i = 0; i < n; ++i) as_ptr<size_t>(va + i * 2 * MiB)[0] = i;
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(i, as_ptr<size_t>(va + i * 2 * MiB)[0]);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, n * 2 * MiB));
  for (auto h : hs) ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, n * 2 * MiB));
  EXPECT_LT(host_mapping_count(), before + 64);
}

// ---- no backing
// -----------------------------------------------------------------------------------

class SimNoBacking : public SimTest {
 protected:
  SimConfig config() const override {
    SimConfig c;
    c.devices = 1;
    c.capacity = 80 * GiB;
    c.backing = false;
    return c;
  }
};

TEST_F(SimNoBacking, BookkeepingOnly) {
  make_current(0);
  const size_t before = host_mapping_count();
  const size_t n = 40960;
  const CUdeviceptr va = reserve(n * 2 * MiB);
  std::vector<CUmemGenericAllocationHandle> hs(n);
  const CUmemAllocationProp prop = device_prop(0);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&hs[i], 2 * MiB, &prop, 0));
  CUmemGenericAllocationHandle extra = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&extra, 2 * MiB, &prop, 0));
  for (size_t i = 0; i < n; i += 2)
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + i * 2 * MiB, 2 * MiB, 0, hs[i], 0));
  for (size_t i = 0; i < n; i += 2) {
    ASSERT_EQ(CUDA_SUCCESS,
              set_access(va + i * 2 * MiB, 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  }
  EXPECT_LT(host_mapping_count(), before + 64);  // not one per page
  EXPECT_FALSE(probe_readable(as_ptr(va)));      // nothing behind it
  size_t free_bytes = 1;
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_EQ(0u, free_bytes);
  for (size_t i = 1; i < n; i += 2)
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va + i * 2 * MiB, 2 * MiB, 0, hs[i], 0));
  ASSERT_EQ(CUDA_SUCCESS, set_access(va, n * 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_EQ(0u, resident_bytes());
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(va, n * 2 * MiB));
  for (auto h : hs) ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(va, n * 2 * MiB));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
}

// Without host memory behind the pages there is nothing to copy: a valid copy is NOT_SUPPORTED
// (after the context, ByteCount-0 and range checks).
TEST_F(SimNoBacking, MemcpyIsNotSupported) {
  make_current(0);
  const Buffer b = make_buffer(2 * MiB);
  uint64_t v = 1;
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().memcpy_htod(b.va, &v, sizeof v));
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, t().memcpy_dtoh(&v, b.va, sizeof v));
  EXPECT_EQ(CUDA_SUCCESS, t().memcpy_dtoh(&v, b.va, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh(&v, b.va + 2 * MiB, sizeof v));
  free_buffer(b);
}

}  // namespace
}  // namespace expanse::sim::testing
