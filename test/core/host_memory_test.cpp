// Out of host memory on the free path: a free either fails whole (std::bad_alloc, the block
// still live, so the caller can free it again) or completes; a block the user freed never stays
// live in the books, even when its free into the books happens later (a thread cache's
// eviction, flush or thread exit) and host memory runs out there. Each test fails the n-th
// host allocation of the operation, persistently or once, for every n until the operation makes
// no more, and then checks the books, frees what is left and sees every byte come back.
#include "expanse/errors.hpp"
#include "host_memory_fixture.hpp"

#include <new>
#include <thread>

namespace expanse::test {
namespace {

core::AllocatorOptions cached_opts(size_t bytes, size_t entries) {
  core::AllocatorOptions o;
  o.thread_cache_bytes = bytes;
  o.thread_cache_entries = entries;
  return o;
}

class HostMemoryTest : public HostMemoryFailureTest {
 protected:
  // Everything freed: release_cached gives every block and every page back.
  void expect_all_back(size_t n) {
    EXPECT_EQ(alloc_->check_invariants(), "") << "failing from allocation " << n;
    alloc_->release_cached();
    const core::DeviceStats st = alloc_->stats();
    EXPECT_EQ(st.live_blocks, 0u) << "blocks freed by the user stay live; failing from " << n;
    EXPECT_EQ(st.allocated_bytes, 0u) << "failing from allocation " << n;
    EXPECT_EQ(sim::outstanding().physical_bytes, 0u) << "failing from allocation " << n;
    EXPECT_EQ(books_vs_driver(), "") << "failing from allocation " << n;
  }
  // A free that threw must have left the block live: freeing it again succeeds.
  void free_again_if_failed(bool threw, void* p, CUstream s, size_t n) {
    if (!threw) return;
    EXPECT_EQ(alloc_->check_invariants(), "") << "failing from allocation " << n;
    EXPECT_NO_THROW(alloc_->deallocate(p, s)) << "a free that threw left the block half freed; "
                                              << "failing from allocation " << n;
  }

  // Parking a 1 MiB block in a cache of 1 MiB evicts the four 256 KiB blocks parked before it,
  // under the lock (the block's first park) or after the lock-free park (parked before). Only
  // the small arena's blocks (up to small_max, 1 MiB) park.
  void evict_all(bool parked_before) {
    size_t n = 1;
    for (bool failed = true; failed; ++n) {
      make(sim_config(1 * GiB), cached_opts(1 * MiB, 16));
      CUstream s = new_stream();
      void* big = alloc_->allocate(1 * MiB, s);
      if (parked_before) {
        alloc_->deallocate(big, s);
        ASSERT_EQ(alloc_->allocate(1 * MiB, s), big) << "a cache hit";
      }
      std::vector<void*> small;
      for (int i = 0; i < 4; ++i) small.push_back(alloc_->allocate(256 * KiB, s));
      for (void* p : small) alloc_->deallocate(p, s);  // parked
      ASSERT_EQ(alloc_->check_invariants(), "");
      const Run r = failing_from(n, [&] { alloc_->deallocate(big, s); });
      failed = r.failed;
      // As users see it, before anything else settles what is owed: only a free that threw
      // leaves its block live.
      const core::DeviceStats seen = alloc_->stats();
      EXPECT_EQ(seen.live_blocks, r.threw ? 1u : 0u) << "failing from allocation " << n;
      EXPECT_EQ(seen.allocated_bytes, r.threw ? 1 * MiB : 0u) << "failing from allocation " << n;
      free_again_if_failed(r.threw, big, s, n);
      expect_all_back(n);
      if (HasFailure()) return;
    }
    EXPECT_GT(n, 3u) << "the eviction made host allocations to fail";
  }
};

TEST_P(HostMemoryTest, EvictionUnderTheLockFreesEveryEvictedBlock) { evict_all(false); }
TEST_P(HostMemoryTest, EvictionAfterALockFreeParkFreesEveryEvictedBlock) { evict_all(true); }

TEST_P(HostMemoryTest, FlushFreesEveryParkedBlock) {
  size_t n = 1;
  for (bool failed = true; failed; ++n) {
    make(sim_config(1 * GiB), cached_opts(64 * MiB, 16));
    CUstream s = new_stream();
    std::vector<void*> v;
    for (int i = 0; i < 4; ++i) v.push_back(alloc_->allocate(1 * MiB, s));
    for (void* p : v) alloc_->deallocate(p, s);  // parked
    // Reported, if it throws; what it could not do, a later call does.
    // Lifting the limit flushes every cache, and does nothing else.
    failed = failing_from(n, [&] { alloc_->set_limit(core::kNoLimit); }).failed;
    expect_all_back(n);
    if (HasFailure()) return;
  }
  EXPECT_GT(n, 3u);
}

TEST_P(HostMemoryTest, ThreadExitGivesEveryParkedBlockBack) {
  size_t n = 1;
  for (bool failed = true; failed; ++n) {
    make(sim_config(1 * GiB), cached_opts(64 * MiB, 16));
    CUstream s = new_stream();
    std::thread t([&] {
      std::vector<void*> v;
      for (int i = 0; i < 4; ++i) v.push_back(alloc_->allocate(1 * MiB, s));
      for (void* p : v) alloc_->deallocate(p, s);  // parked
      HostAllocFailure fail(n, GetParam().count);
      fail.keep_armed();  // the thread's exit gives its cache back: that fails too
    });
    t.join();
    // The exit made at most a few dozen allocations: n past them fails nothing.
    failed = n < 64;
    expect_all_back(n);
    if (HasFailure()) return;
  }
}

// The locked path: a block another stream used (record_stream) waits for it after the free.
TEST_P(HostMemoryTest, LockedFreeFailsWholeOrCompletes) {
  size_t n = 1;
  for (bool failed = true; failed; ++n) {
    make(sim_config(1 * GiB));
    CUstream s = new_stream(), other = new_stream();
    void* keep = alloc_->allocate(1 * MiB, s);
    void* p = alloc_->allocate(2 * MiB, s);
    alloc_->record_stream(p, other);
    const Run r = failing_from(n, [&] { alloc_->deallocate(p, s); });
    failed = r.failed;
    free_again_if_failed(r.threw, p, s, n);
    alloc_->deallocate(keep, s);
    expect_all_back(n);
    if (HasFailure()) return;
  }
  EXPECT_GT(n, 2u);
}

EXPANSE_INSTANTIATE_FAILING(HostMemoryTest);

}  // namespace
}  // namespace expanse::test
