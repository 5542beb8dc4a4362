// Pools (src/core/pool_table.hpp), one rule at a time: a pool's freed memory serves only that
// pool; the default pool never takes a live pool's pages, even under pressure; a released pool's
// memory serves the default pool once a synchronize proves its work done (never during an
// announced capture); misuse is a usage_error naming the pool and changes nothing; a default block
// freed with join=P becomes P's; slots are reused.
#include "core/streams/capture_announcements.hpp"
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <string>

namespace expanse::test {
namespace {

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class PoolTest : public CoreTest {
 protected:
  // 64 pages of 2 MiB.
  void SetUp() override { make(sim_config(128 * MiB)); }
};

TEST_F(PoolTest, BlockFreedInAPoolIsReusedOnlyByThatPool) {
  alloc_->create_pool(7);
  void* p = alloc_->allocate(1 * MiB, nullptr, 7);
  alloc_->deallocate(p, nullptr);
  EXPECT_EQ(alloc_->pool_stats(7).cached_bytes, 2 * MiB);  // it took a whole page
  EXPECT_EQ(alloc_->pool_stats(7).live_blocks, 0u);
  // The default pool, same size, same stream: not there.
  void* d = alloc_->allocate(1 * MiB, nullptr);
  EXPECT_FALSE(overlap(d, 1 * MiB, p, 1 * MiB));
  // Another pool: not there either.
  alloc_->create_pool(8);
  void* o = alloc_->allocate(1 * MiB, nullptr, 8);
  EXPECT_FALSE(overlap(o, 1 * MiB, p, 1 * MiB));
  // Pool 7 itself: there.
  void* q = alloc_->allocate(1 * MiB, nullptr, 7);
  EXPECT_EQ(q, p);
  EXPECT_EQ(alloc_->pool_stats(7).cached_bytes, 1 * MiB);  // the rest of its page
  const core::PoolStats st = alloc_->pool_stats(7);
  EXPECT_EQ(st.live_blocks, 1u);
  EXPECT_EQ(st.requested_bytes, 1 * MiB);
  EXPECT_EQ(st.live_bytes, 1 * MiB);
  EXPECT_EQ(st.use_count, 1);
  EXPECT_FALSE(st.returned);
  for (void* b : {d, o, q}) alloc_->deallocate(b, nullptr);
  alloc_->release_pool(7);
  alloc_->release_pool(8);
  alloc_->release_cached();
  EXPECT_FALSE(alloc_->has_pool(7));
  EXPECT_FALSE(alloc_->has_pool(8));
}

TEST_F(PoolTest, DefaultPoolCannotTakeALivePoolsPagesUnderPressure) {
  const size_t P = alloc_->page_size();
  alloc_->create_pool(11);
  void* big = alloc_->allocate(48 * P, nullptr, 11);
  fill_pattern(big, 48 * P, 1);
  alloc_->deallocate(big, nullptr);  // 48 pages of free memory, pool 11's
  const CUmemGenericAllocationHandle h0 = handle_at(reinterpret_cast<CUdeviceptr>(big));
  const core::DeviceStats before = alloc_->stats();
  const core::PoolStats pbefore = alloc_->pool_stats(11);
  EXPECT_EQ(pbefore.cached_bytes, 48 * P);
  EXPECT_EQ(pbefore.physical_bytes, 48 * P);
  try {
    void* p = alloc_->allocate(17 * P, nullptr);  // 16 pages are left
    ADD_FAILURE() << "the default pool took pages of live pool 11 at " << p;
    alloc_->deallocate(p, nullptr);
  } catch (const out_of_memory& e) {
    EXPECT_TRUE(contains(e.what(), "pool 11")) << e.what();
  }
  // Nothing of the pool moved.
  EXPECT_EQ(alloc_->stats().mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(alloc_->pool_stats(11).cached_bytes, 48 * P);
  EXPECT_EQ(alloc_->pool_stats(11).physical_bytes, 48 * P);
  EXPECT_EQ(handle_at(reinterpret_cast<CUdeviceptr>(big)), h0);
  for (size_t i = 0; i < 48; ++i) {
    EXPECT_NE(access_at(reinterpret_cast<CUdeviceptr>(big) + i * P), -1) << "page " << i;
  }
  // What is left is all the default pool's (invariant 1, exact): 16 pages.
  void* d = alloc_->allocate(16 * P, nullptr);
  EXPECT_FALSE(overlap(d, 16 * P, big, 48 * P));
  EXPECT_THROW(alloc_->allocate(512, nullptr), out_of_memory);
  // The pool itself still has its memory, in place.
  void* again = alloc_->allocate(48 * P, nullptr, 11);
  EXPECT_EQ(again, big);
  alloc_->deallocate(again, nullptr);
  alloc_->deallocate(d, nullptr);
  EXPECT_EQ(alloc_->check_invariants(), "");
  alloc_->release_pool(11);
}

TEST_F(PoolTest, ReleasedPoolsMemoryServesTheDefaultPoolAfterReleaseCached) {
  const size_t P = alloc_->page_size();
  alloc_->create_pool(21);
  void* big = alloc_->allocate(48 * P, nullptr, 21);
  alloc_->deallocate(big, nullptr);
  alloc_->release_pool(21);
  EXPECT_TRUE(alloc_->has_pool(21));  // its free memory waits for a synchronize
  EXPECT_FALSE(alloc_->pool_stats(21).returned);
  EXPECT_EQ(alloc_->pool_stats(21).use_count, 0);
  alloc_->release_cached();
  EXPECT_FALSE(alloc_->has_pool(21));
  void* d = alloc_->allocate(64 * P, nullptr);  // the whole device
  ASSERT_NE(d, nullptr);
  fill_pattern(d, 64 * P, 2);
  EXPECT_EQ(check_pattern(d, 64 * P, 2), SIZE_MAX);
  alloc_->deallocate(d, nullptr);
}

TEST_F(PoolTest, ReleasedPoolsMemoryIsReturnedByAnAllocationThatWouldFailOtherwise) {
  const size_t P = alloc_->page_size();
  alloc_->create_pool(22);
  void* big = alloc_->allocate(48 * P, nullptr, 22);
  alloc_->deallocate(big, nullptr);
  alloc_->release_pool(22);
  void* d = alloc_->allocate(64 * P, nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(alloc_->has_pool(22));
  alloc_->deallocate(d, nullptr);
}

TEST_F(PoolTest, LiveBlocksOfAReleasedPoolStayValidAndGoToTheDefaultPoolWhenFreed) {
  const size_t P = alloc_->page_size();
  alloc_->create_pool(23);
  void* keep = alloc_->allocate(3 * P + 512, nullptr, 23);
  fill_pattern(keep, 3 * P + 512, 3);
  void* gone = alloc_->allocate(8 * P, nullptr, 23);
  alloc_->deallocate(gone, nullptr);
  alloc_->release_pool(23);
  EXPECT_THROW(alloc_->allocate(512, nullptr, 23), usage_error);
  EXPECT_TRUE(alloc_->trim_pool(23));
  core::PoolStats st = alloc_->pool_stats(23);
  EXPECT_TRUE(st.returned);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(st.live_blocks, 1u);
  EXPECT_EQ(st.requested_bytes, 3 * P + 512);
  EXPECT_EQ(books_vs_driver(), "");
  EXPECT_EQ(check_pattern(keep, 3 * P + 512, 3), SIZE_MAX);
  alloc_->deallocate(keep, nullptr);
  EXPECT_FALSE(alloc_->has_pool(23));
  // Its block is the default pool's now: the default pool reuses it.
  void* d = alloc_->allocate(3 * P + 512, nullptr);
  EXPECT_EQ(d, keep);
  alloc_->deallocate(d, nullptr);
}

TEST_F(PoolTest, TrimOfAPoolInUseIsAUsageErrorNamingItAndChangesNothing) {
  alloc_->create_pool(31);
  void* p = alloc_->allocate(5 * MiB, nullptr, 31);
  alloc_->deallocate(p, nullptr);
  const core::DeviceStats before = alloc_->stats();
  const core::PoolStats pbefore = alloc_->pool_stats(31);
  try {
    alloc_->trim_pool(31);
    ADD_FAILURE() << "trim_pool of a pool in use did not throw";
  } catch (const usage_error& e) {
    EXPECT_TRUE(contains(e.what(), "pool 31")) << e.what();
  }
  const core::DeviceStats after = alloc_->stats();
  const core::PoolStats pafter = alloc_->pool_stats(31);
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(after.physical_bytes, before.physical_bytes);
  EXPECT_EQ(pafter.cached_bytes, pbefore.cached_bytes);
  EXPECT_EQ(pafter.physical_bytes, pbefore.physical_bytes);
  EXPECT_EQ(pafter.use_count, 1);
  EXPECT_FALSE(pafter.returned);
  EXPECT_EQ(alloc_->allocate(5 * MiB, nullptr, 31), p);
  alloc_->deallocate(p, nullptr);
  alloc_->release_pool(31);
}

TEST_F(PoolTest, TrimDuringAnAnnouncedCaptureReturnsFalseAndChangesNothing) {
  const size_t P = alloc_->page_size();
  alloc_->create_pool(41);
  void* p = alloc_->allocate(40 * P, nullptr, 41);
  alloc_->deallocate(p, nullptr);
  alloc_->release_pool(41);
  const CUmemGenericAllocationHandle h0 = handle_at(reinterpret_cast<CUdeviceptr>(p));
  const core::DeviceStats before = alloc_->stats();
  const core::PoolStats pbefore = alloc_->pool_stats(41);
  const uint64_t syncs = sim::call_count(driver::EntryPoint::ctx_synchronize);
  auto pool_unchanged = [&]() {
    const core::PoolStats now = alloc_->pool_stats(41);
    EXPECT_EQ(now.cached_bytes, pbefore.cached_bytes);
    EXPECT_EQ(now.physical_bytes, pbefore.physical_bytes);
    EXPECT_FALSE(now.returned);
    EXPECT_EQ(handle_at(reinterpret_cast<CUdeviceptr>(p)), h0);
    EXPECT_EQ(access_at(reinterpret_cast<CUdeviceptr>(p) + 39 * P),
              CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  };
  {
    PrimaryCtx ctx(drv_->table());
    core::CaptureAnnouncements::begin(ctx.ctx_);
    EXPECT_FALSE(alloc_->trim_pool(41));
    const core::DeviceStats after = alloc_->stats();
    EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
    EXPECT_EQ(after.physical_bytes, before.physical_bytes);
    EXPECT_EQ(after.num_released_pages, before.num_released_pages);
    pool_unchanged();
    // An allocation that would need the released pool's memory cannot have it either: no
    // synchronize while a capture is announced. (It may leave pages it created in the handle
    // pool, as any failed request may.)
    EXPECT_THROW(alloc_->allocate(30 * P, nullptr), out_of_memory);
    pool_unchanged();
    core::CaptureAnnouncements::end(ctx.ctx_);
  }
  EXPECT_EQ(sim::call_count(driver::EntryPoint::ctx_synchronize), syncs);
  EXPECT_EQ(books_vs_driver(), "");
  // Once the capture ends, the trim goes through.
  EXPECT_TRUE(alloc_->trim_pool(41));
  EXPECT_FALSE(alloc_->has_pool(41));
  EXPECT_LT(alloc_->stats().mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(books_vs_driver(), "");
  void* d = alloc_->allocate(64 * P, nullptr);
  EXPECT_NE(d, nullptr);
  alloc_->deallocate(d, nullptr);
}

TEST_F(PoolTest, ReleaseRetainOrTrimOfAnUnknownOrReleasedPoolIsAUsageErrorNamingIt) {
  auto expect_usage_error_naming = [](auto&& f, uint64_t id) {
    try {
      f();
      ADD_FAILURE() << "no usage_error for pool " << id;
    } catch (const usage_error& e) {
      EXPECT_TRUE(contains(e.what(), "pool " + std::to_string(id))) << e.what();
    }
  };
  expect_usage_error_naming([&] { alloc_->release_pool(12345); }, 12345);
  expect_usage_error_naming([&] { alloc_->retain_pool(12345); }, 12345);
  expect_usage_error_naming([&] { alloc_->trim_pool(12345); }, 12345);
  expect_usage_error_naming([&] { alloc_->pool_stats(12345); }, 12345);
  expect_usage_error_naming([&] { alloc_->allocate(512, nullptr, 12345); }, 12345);
  EXPECT_THROW(alloc_->create_pool(0), usage_error);

  alloc_->create_pool(5);
  void* p = alloc_->allocate(512, nullptr, 5);  // a live block keeps the released pool known
  alloc_->release_pool(5);
  const core::DeviceStats before = alloc_->stats();
  expect_usage_error_naming([&] { alloc_->release_pool(5); }, 5);
  expect_usage_error_naming([&] { alloc_->retain_pool(5); }, 5);
  expect_usage_error_naming([&] { alloc_->allocate(512, nullptr, 5); }, 5);
  expect_usage_error_naming([&] { alloc_->create_pool(5); }, 5);
  EXPECT_EQ(alloc_->pool_stats(5).use_count, 0);
  EXPECT_EQ(alloc_->pool_stats(5).live_blocks, 1u);
  EXPECT_EQ(alloc_->stats().live_blocks, before.live_blocks);
  EXPECT_EQ(alloc_->stats().num_allocs, before.num_allocs);
  alloc_->deallocate(p, nullptr);
  alloc_->release_cached();
  // Forgotten now: still an error, never a new pool.
  EXPECT_FALSE(alloc_->has_pool(5));
  expect_usage_error_naming([&] { alloc_->release_pool(5); }, 5);
  expect_usage_error_naming([&] { alloc_->trim_pool(5); }, 5);
  expect_usage_error_naming([&] { alloc_->create_pool(5); }, 5);
  EXPECT_EQ(alloc_->check_invariants(), "");
}

TEST_F(PoolTest, DefaultBlockFreedWithJoinBecomesThePoolsMemory) {
  alloc_->create_pool(51);
  void* q = alloc_->allocate(1 * MiB, nullptr);
  const uint64_t cached0 = alloc_->pool_stats(51).cached_bytes;
  alloc_->deallocate(q, nullptr, 0, 51);
  EXPECT_EQ(alloc_->pool_stats(51).cached_bytes, cached0 + 1 * MiB);
  EXPECT_EQ(alloc_->pool_stats(51).live_blocks, 0u);
  void* d = alloc_->allocate(1 * MiB, nullptr);
  EXPECT_FALSE(overlap(d, 1 * MiB, q, 1 * MiB)) << "the default pool reused a block that joined pool 51";
  void* r = alloc_->allocate(1 * MiB, nullptr, 51);
  EXPECT_EQ(r, q) << "the pool did not reuse the block that joined it";
  EXPECT_EQ(alloc_->pool_stats(51).live_blocks, 1u);
  alloc_->deallocate(r, nullptr);
  alloc_->deallocate(d, nullptr);
  // A join to a released pool leaves the block the default pool's.
  alloc_->release_pool(51);
  void* e = alloc_->allocate(2 * MiB, nullptr);
  alloc_->deallocate(e, nullptr, 0, 51);
  void* f = alloc_->allocate(2 * MiB, nullptr);
  EXPECT_EQ(f, e);
  alloc_->deallocate(f, nullptr);
  // A pool's own block freed with join=another pool stays its own pool's.
  alloc_->create_pool(52);
  alloc_->create_pool(53);
  void* g = alloc_->allocate(1 * MiB, nullptr, 52);
  alloc_->deallocate(g, nullptr, 0, 53);
  EXPECT_EQ(alloc_->pool_stats(52).cached_bytes, 2 * MiB);  // its whole page
  EXPECT_EQ(alloc_->pool_stats(53).cached_bytes, 0u);
  alloc_->release_pool(52);
  alloc_->release_pool(53);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->check_invariants(), "");
}

TEST_F(PoolTest, SlotsAreReusedOnceTheirPoolsAreForgotten) {
  // PoolSlot is 16 bits: 70000 pools one after another fit only if slots come back.
  for (uint64_t id = 1; id <= 70000; ++id) {
    alloc_->create_pool(id);
    alloc_->release_pool(id);
    ASSERT_FALSE(alloc_->has_pool(id)) << "pool " << id;
  }
  // With memory: each pool allocates and frees, then is released and returned.
  for (uint64_t id = 100001; id <= 100000 + 70000; ++id) {
    alloc_->create_pool(id);
    void* p = alloc_->allocate(512, nullptr, id);
    alloc_->deallocate(p, nullptr);
    alloc_->release_pool(id);
    if (id % 1000 == 0) {
      alloc_->release_cached();
      ASSERT_FALSE(alloc_->has_pool(id));
      ASSERT_EQ(alloc_->check_invariants(), "") << "pool " << id;
    }
  }
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
}

// FAILS at the time of writing (reported to the lead, not fixed here): released pools whose
// memory waits for a synchronize keep their slots, and create_pool refuses the 65536th pool
// ("65535 pools are in use (release some ...)") although every one of them was released. Creating
// a pool when every slot is held so should return released pools first (as an allocation that
// would fail does), unless a capture is announced.
TEST_F(PoolTest, CreatingPoolsNeverRunsOutOfSlotsWhileReleasedPoolsCanBeReturned) {
#ifdef EXPANSE_CHECKED
  // Every call checks all 65535 pools' books there: about ten minutes.
  GTEST_SKIP() << "too slow in the checked build";
#endif
  for (uint64_t id = 1; id <= 70000; ++id) {
    alloc_->create_pool(id);
    void* p = alloc_->allocate(512, nullptr, id);
    alloc_->deallocate(p, nullptr);
    alloc_->release_pool(id);
  }
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
}

}  // namespace
}  // namespace expanse::test
