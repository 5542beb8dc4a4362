// How a pool holds pages: whole pages taken from the default pool (no page of a pool's own block
// holds another pool's block), never unmapped while the pool is in use, even under pressure from
// the default pool or from the pool itself, and back in the default pool's hands once released
// and proven done.
#include "core_fixture.hpp"

#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <set>

namespace expanse::test {
namespace {

constexpr size_t P = 2 * MiB;  // the sim's granularity

class PoolPagesTest : public CoreTest {
 protected:
  void SetUp() override { make(sim_config(16 * P)); }
  // The pages [first, last] that [p, p+n) touches.
  static std::pair<uintptr_t, uintptr_t> pages_of(const void* p, size_t n) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return {a / P, (a + n - 1) / P};
  }
};

TEST_F(PoolPagesTest, APoolsBlocksShareNoPageWithTheDefaultPools) {
  alloc_->create_pool(7);
  std::vector<std::pair<void*, size_t>> dflt, pooled;
  // Interleaved small allocations: without whole pages they would pack into the same pages.
  for (int i = 0; i < 12; ++i) {
    dflt.emplace_back(alloc_->allocate(3000 + 512 * i, nullptr), 3000 + 512 * i);
    pooled.emplace_back(alloc_->allocate(5000 + 512 * i, nullptr, 7), 5000 + 512 * i);
  }
  std::set<uintptr_t> pool_pages;
  for (auto [p, n] : pooled) {
    auto [a, z] = pages_of(p, n);
    for (uintptr_t i = a; i <= z; ++i) pool_pages.insert(i);
  }
  for (auto [p, n] : dflt) {
    auto [a, z] = pages_of(p, n);
    for (uintptr_t i = a; i <= z; ++i) {
      EXPECT_EQ(pool_pages.count(i), 0u) << "default block " << p << " shares a page with pool 7";
    }
  }
  // The pool's small blocks pack into the page it took: one page for all twelve.
  EXPECT_EQ(pool_pages.size(), 1u);
  const core::PoolStats st = alloc_->pool_stats(7);
  EXPECT_EQ(st.physical_bytes, P);
  EXPECT_EQ(st.live_blocks, 12u);
  for (auto [p, n] : dflt) alloc_->deallocate(p, nullptr);
  for (auto [p, n] : pooled) alloc_->deallocate(p, nullptr);
  alloc_->release_pool(7);
  alloc_->release_cached();
}

TEST_F(PoolPagesTest, ALivePoolsFreeMemoryStaysMappedUnderPressure) {
  alloc_->create_pool(3);
  // The pool holds 6 pages, all freed again (a capture's temporaries).
  void* g = alloc_->allocate(6 * P, nullptr, 3);
  const auto base = reinterpret_cast<CUdeviceptr>(g);
  alloc_->deallocate(g, nullptr);
  EXPECT_EQ(alloc_->pool_stats(3).cached_bytes, 6 * P);
  // The default pool wants all the rest: 10 pages fit, 11 do not while the pool is in use.
  void* big = alloc_->allocate(10 * P, nullptr);
  ASSERT_NE(big, nullptr);
  alloc_->deallocate(big, nullptr);
  try {
    alloc_->allocate(11 * P, nullptr);
    FAIL() << "the default pool took a live pool's pages";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("pool 3 (use count 1"), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NE(handle_at(base + i * P), 0u) << "page " << i << " of pool 3 was unmapped";
  }
  // Nor does the pool unmap its own pages to place a block that does not fit them as mapped.
  void* own = alloc_->allocate(3 * P, nullptr, 3);
  for (size_t i = 0; i < 6; ++i) EXPECT_NE(handle_at(base + i * P), 0u);
  alloc_->deallocate(own, nullptr);
  // Released and proven done (release_cached synchronizes): its pages serve the default pool.
  alloc_->release_pool(3);
  alloc_->release_cached();
  void* all = alloc_->allocate(16 * P, nullptr);
  ASSERT_NE(all, nullptr);
  alloc_->deallocate(all, nullptr);
  EXPECT_THROW(alloc_->pool_stats(3), usage_error);  // forgotten: nothing of it is left
}

TEST_F(PoolPagesTest, AReleasedPoolsMemoryReturnsWhenAnAllocationNeedsIt) {
  alloc_->create_pool(9);
  void* g = alloc_->allocate(8 * P, nullptr, 9);
  alloc_->deallocate(g, nullptr);
  alloc_->release_pool(9);
  // No release_cached: the allocation that would fail proves the pool's work done itself.
  void* all = alloc_->allocate(16 * P, nullptr);
  ASSERT_NE(all, nullptr);
  alloc_->deallocate(all, nullptr);
}

TEST_F(PoolPagesTest, AnAnnouncedCaptureKeepsAReleasedPoolsMemoryAway) {
  alloc_->create_pool(4);
  void* g = alloc_->allocate(8 * P, nullptr, 4);
  alloc_->deallocate(g, nullptr);
  alloc_->release_pool(4);
  core::CaptureAnnouncements::begin(alloc_->driver().primary());
  EXPECT_FALSE(alloc_->trim_pool(4));  // a synchronize would invalidate the capture
  EXPECT_THROW(alloc_->allocate(16 * P, nullptr), out_of_memory);
  EXPECT_EQ(alloc_->pool_stats(4).cached_bytes, 8 * P);
  core::CaptureAnnouncements::end(alloc_->driver().primary());
  EXPECT_TRUE(alloc_->trim_pool(4));
  void* all = alloc_->allocate(16 * P, nullptr);
  ASSERT_NE(all, nullptr);
  alloc_->deallocate(all, nullptr);
}

}  // namespace
}  // namespace expanse::test
