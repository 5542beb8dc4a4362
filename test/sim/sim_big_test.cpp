// THE big one: a whole 80 GiB device of 2 MiB pages, mapped every other page and then the rest,
// with data written and verified through the host, inside vm.max_map_count.
#include <chrono>
#include <cstdio>
#include <vector>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

constexpr size_t kPage = 2 * MiB;
constexpr size_t kPages = 40960;  // 80 GiB
constexpr size_t kMaxMapCount = 65530;

class SimBig : public SimTest {
 protected:
  SimConfig config() const override {
    SimConfig c;
    c.devices = 1;
    c.capacity = kPages * kPage;
    c.granularity = kPage;
    return c;
  }
};

// The handle mapped at page p: a permutation, so that neighbouring pages are never neighbouring
// extents of the memfd and the host cannot merge their mappings (the worst case for map count).
size_t handle_of_page(size_t p) { return (p * 7919) % kPages; }

uint64_t pattern(size_t page, int where) {
  return 0x9E3779B97F4A7C15ull ^ (uint64_t{page} << 8) ^ static_cast<uint64_t>(where);
}

void write_page(CUdeviceptr base, size_t p) {
  auto* first = as_ptr<uint64_t>(base + p * kPage);
  auto* last = as_ptr<uint64_t>(base + (p + 1) * kPage - sizeof(uint64_t));
  *first = pattern(handle_of_page(p), 1);
  *last = pattern(handle_of_page(p), 2);
}

bool check_page(CUdeviceptr base, size_t p) {
  const auto* first = as_ptr<const uint64_t>(base + p * kPage);
  const auto* last = as_ptr<const uint64_t>(base + (p + 1) * kPage - sizeof(uint64_t));
  return *first == pattern(handle_of_page(p), 1) && *last == pattern(handle_of_page(p), 2);
}

TEST_F(SimBig, EightyGiBEveryOtherPageThenTheRest) {
  const auto start = std::chrono::steady_clock::now();
  make_current(0);
  const size_t total = kPages * kPage;
  const size_t maps_before = host_mapping_count();

  CUdeviceptr base = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&base, total, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(kPages);
  const CUmemAllocationProp prop = device_prop(0);
  for (size_t i = 0; i < kPages; ++i) {
    ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&handles[i], kPage, &prop, 0)) << i;
  }
  size_t free_bytes = 1;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_EQ(0u, free_bytes);
  CUmemGenericAllocationHandle extra = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, t().mem_create(&extra, kPage, &prop, 0));

  // Pass 1: even pages, access granted page by page.
  const CUmemAccessDesc rw = access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (size_t p = 0; p < kPages; p += 2) {
    const CUdeviceptr va = base + p * kPage;
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(va, kPage, 0, handles[handle_of_page(p)], 0)) << p;
    ASSERT_EQ(CUDA_SUCCESS, t().mem_set_access(va, kPage, &rw, 1)) << p;
    write_page(base, p);
  }
  const size_t maps_half = host_mapping_count();
  EXPECT_LT(maps_half, kMaxMapCount);
  EXPECT_EQ(kPages / 2, outstanding().mappings);

  // Pass 2: odd pages, access granted once over the whole (now fully mapped) range.
  for (size_t p = 1; p < kPages; p += 2) {
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(base + p * kPage, kPage, 0, handles[handle_of_page(p)], 0))
        << p;
  }
  ASSERT_EQ(CUDA_SUCCESS, t().mem_set_access(base, total, &rw, 1));
  for (size_t p = 1; p < kPages; p += 2) write_page(base, p);
  const size_t maps_full = host_mapping_count();
  EXPECT_LT(maps_full, kMaxMapCount);
  for (size_t p = 0; p < kPages; ++p) ASSERT_TRUE(check_page(base, p)) << "page " << p;
  EXPECT_EQ(kPages, outstanding().mappings);
  EXPECT_EQ(total, outstanding().mapped_bytes);

  // One unmap for 40960 adjacent mappings.
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(base, total));
  EXPECT_EQ(0u, outstanding().mappings);
  EXPECT_EQ(kPages, outstanding().allocations);
  for (auto h : handles) ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_EQ(total, free_bytes);
  EXPECT_EQ(0u, resident_bytes());
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(base, total));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
  EXPECT_LT(host_mapping_count(), maps_before + 64);  // slack: the heap maps memory too

  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[          ] 80 GiB: host mappings %zu before, %zu half mapped, %zu fully mapped; %.2f s; "
      "modeled driver time %.2f s\n",
      maps_before, maps_half, maps_full, secs, modeled_seconds());
}

// Handles reused across passes: map all pages, unmap every other one, remap it elsewhere.
TEST_F(SimBig, RemapHalfOfTheDeviceInPlace) {
  const size_t total = kPages * kPage;
  CUdeviceptr a = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&a, total, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(kPages);
  const CUmemAllocationProp prop = device_prop(0);
  for (auto& h : handles) ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&h, kPage, &prop, 0));
  for (size_t p = 0; p < kPages; ++p) {
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(a + p * kPage, kPage, 0, handles[p], 0));
  }
  EXPECT_LT(host_mapping_count(), 1000u);  // in-order extents merge
  // Unmap every other page, one call each, then map the freed handles back in reverse order.
  for (size_t p = 1; p < kPages; p += 2)
    ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(a + p * kPage, kPage));
  EXPECT_LT(host_mapping_count(), kMaxMapCount);
  for (size_t p = 1; p < kPages; p += 2) {
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(a + p * kPage, kPage, 0, handles[kPages - p], 0));
  }
  EXPECT_LT(host_mapping_count(), kMaxMapCount);
  const CUmemAccessDesc rw = access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(CUDA_SUCCESS, t().mem_set_access(a, total, &rw, 1));
  for (size_t p = 0; p < kPages; p += 97) *as_ptr<size_t>(a + p * kPage) = p;
  for (size_t p = 0; p < kPages; p += 97) ASSERT_EQ(p, *as_ptr<size_t>(a + p * kPage));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(a, total));
  for (auto h : handles) ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(a, total));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
}

}  // namespace
}  // namespace expanse::sim::testing

namespace expanse::sim::testing {
namespace {

// Scale: 40960 live mappings and a million calls; every lookup is O(log n).
class SimScale : public SimTest {
 protected:
  SimConfig config() const override {
    SimConfig c;
    c.devices = 1;
    c.capacity = kPages * kPage;
    c.backing = false;
    return c;
  }
};

TEST_F(SimScale, MillionCallsOverFortyThousandMappings) {
  const auto start = std::chrono::steady_clock::now();
  const size_t total = kPages * kPage;
  CUdeviceptr base = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&base, total, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(kPages);
  const CUmemAllocationProp prop = device_prop(0);
  for (auto& h : handles) ASSERT_EQ(CUDA_SUCCESS, t().mem_create(&h, kPage, &prop, 0));
  for (size_t p = 0; p < kPages; ++p)
    ASSERT_EQ(CUDA_SUCCESS, t().mem_map(base + p * kPage, kPage, 0, handles[p], 0));
  reset_counts();
  const CUmemAccessDesc rw = access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  const CUmemLocation loc = device_location(0);
  uint64_t x = 88172645463325252ull;  // xorshift
  size_t ok = 0;
  for (int i = 0; i < 250000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const size_t p = x % kPages;
    const CUdeviceptr va = base + p * kPage;
    ok += t().mem_unmap(va, kPage) == CUDA_SUCCESS;
    ok += t().mem_map(va, kPage, 0, handles[p], 0) == CUDA_SUCCESS;
    ok += t().mem_set_access(va, kPage, &rw, 1) == CUDA_SUCCESS;
    unsigned long long f = 0;
    ok += t().mem_get_access(&f, &loc, va + 4096) == CUDA_SUCCESS && f == 3;
  }
  EXPECT_EQ(1000000u, ok);
  EXPECT_EQ(1000000u, total_calls());
  ASSERT_EQ(CUDA_SUCCESS, t().mem_unmap(base, total));
  for (auto h : handles) ASSERT_EQ(CUDA_SUCCESS, t().mem_release(h));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_address_free(base, total));
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[          ] 1e6 calls over 40960 mappings: %.2f s\n", secs);
}

}  // namespace
}  // namespace expanse::sim::testing
