// Sleep and wake of a pool on the sim: every page goes back to the driver, addresses stay, an
// offloaded pool's bytes come back, nothing grows over cycles, and a driver failure at any step
// leaves the pool whole (awake after a failed sleep, asleep with its backup after a failed wake).
#include "core_fixture.hpp"

#include <algorithm>
#include <random>

#include "conf/config.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

namespace expanse::test {
namespace {

constexpr size_t P = 2 * MiB;
using Mode = core::DeviceAllocator::SleepMode;

class PoolSleepTest : public CoreTest {
 protected:
  void SetUp() override { make(sim_config(32 * P)); }

  struct Held {
    void* p;
    size_t n;
    uint64_t seed;
  };
  // A weights-like pool: blocks of several sizes, each filled with a pattern.
  std::vector<Held> fill_pool(core::PoolId id, uint64_t seed0 = 1) {
    std::vector<Held> out;
    const size_t sizes[] = {3 * P + 4096, 700, 5 * P, 64 * KiB, 2 * P};
    uint64_t seed = seed0;
    for (size_t n : sizes) {
      void* p = alloc_->allocate(n, nullptr, id);
      fill_pattern(p, n, seed);
      out.push_back({p, n, seed++});
    }
    return out;
  }
  size_t driver_free() {
    PrimaryCtx c(drv_->table());
    size_t free = 0, total = 0;
    drv_->table().mem_get_info(&free, &total);
    return free;
  }
  void expect_intact(const std::vector<Held>& blocks) {
    for (const Held& h : blocks) {
      EXPECT_EQ(check_pattern(h.p, h.n, h.seed), SIZE_MAX) << "block " << h.p << " lost its bytes";
    }
  }
  void free_all(const std::vector<Held>& blocks) {
    for (const Held& h : blocks) alloc_->deallocate(h.p, nullptr);
  }
};

TEST_F(PoolSleepTest, OffloadGivesEveryPageBackAndBringsEveryByteBackAtTheSameAddress) {
  alloc_->create_pool(1);
  void* other = alloc_->allocate(3 * P, nullptr);  // the default pool's, untouched by the sleep
  fill_pattern(other, 3 * P, 99);
  const auto blocks = fill_pool(1);
  const size_t pool_physical = alloc_->pool_stats(1).physical_bytes;
  const size_t free_before = driver_free();
  ASSERT_TRUE(alloc_->sleep_pool(1, Mode::offload));
  EXPECT_TRUE(alloc_->pool_is_asleep(1));
  EXPECT_EQ(driver_free(), free_before + pool_physical) << "the driver got every page back";
  EXPECT_EQ(alloc_->pool_stats(1).physical_bytes, 0u);
  EXPECT_GT(alloc_->pool_stats(1).host_backup_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->wake_pool(1);
  EXPECT_FALSE(alloc_->pool_is_asleep(1));
  expect_intact(blocks);
  EXPECT_EQ(check_pattern(other, 3 * P, 99), SIZE_MAX);
  EXPECT_EQ(books_vs_driver(), "");
  free_all(blocks);
  alloc_->deallocate(other, nullptr);
  alloc_->release_pool(1);
}

TEST_F(PoolSleepTest, WhileAsleepThePoolsMemoryServesOthersAndTheBlocksRefuseUse) {
  alloc_->create_pool(2);
  const auto blocks = fill_pool(2);
  alloc_->sleep_pool(2, Mode::offload);
  EXPECT_THROW(alloc_->allocate(100, nullptr, 2), usage_error);
  EXPECT_THROW(alloc_->record_stream(blocks[0].p, nullptr), usage_error);
  // The whole device but what the default pool holds: the sleeping pool's pages included.
  void* big = alloc_->allocate(32 * P, nullptr);
  ASSERT_NE(big, nullptr);
  alloc_->deallocate(big, nullptr);
  // A free while asleep is allowed: that block does not come back.
  alloc_->deallocate(blocks[1].p, nullptr);
  alloc_->wake_pool(2);
  expect_intact({blocks[0], blocks[2], blocks[3], blocks[4]});
  EXPECT_EQ(alloc_->pool_stats(2).live_blocks, 4u);
  for (size_t i : {0, 2, 3, 4}) alloc_->deallocate(blocks[i].p, nullptr);
  alloc_->release_pool(2);
}

TEST_F(PoolSleepTest, DiscardDropsTheBytesButKeepsTheAddressesUsable) {
  alloc_->create_pool(3);
  const auto blocks = fill_pool(3);
  const size_t free_before = driver_free();
  const size_t pool_physical = alloc_->pool_stats(3).physical_bytes;
  alloc_->sleep_pool(3, Mode::discard);
  EXPECT_EQ(driver_free(), free_before + pool_physical);
  EXPECT_EQ(alloc_->pool_stats(3).host_backup_bytes, 0u);
  alloc_->wake_pool(3);
  for (const Held& h : blocks) fill_pattern(h.p, h.n, h.seed + 50);  // writable again
  for (const Held& h : blocks) EXPECT_EQ(check_pattern(h.p, h.n, h.seed + 50), SIZE_MAX);
  free_all(blocks);
  alloc_->release_pool(3);
}

TEST_F(PoolSleepTest, DiscardZeroedBringsTheBlocksBackZeroed) {
  alloc_->create_pool(7);
  const auto blocks = fill_pool(7);
  const uint64_t memsets0 = sim::call_count(driver::EntryPoint::memset_d8_async);
  ASSERT_TRUE(alloc_->sleep_pool(7, Mode::discard_zeroed));
  EXPECT_EQ(alloc_->pool_stats(7).host_backup_bytes, 0u) << "nothing to keep";
  alloc_->wake_pool(7);
  EXPECT_GT(sim::call_count(driver::EntryPoint::memset_d8_async), memsets0);
  for (const Held& h : blocks) {
    const auto* b = static_cast<const unsigned char*>(h.p);
    size_t nonzero = 0;
    for (size_t i = 0; i < h.n; ++i) nonzero += b[i] != 0;
    EXPECT_EQ(nonzero, 0u) << "block " << h.p << " of " << h.n << " bytes";
  }
  // The next sleep without the option: a plain discard zeroes nothing.
  ASSERT_TRUE(alloc_->sleep_pool(7, Mode::discard));
  const uint64_t memsets1 = sim::call_count(driver::EntryPoint::memset_d8_async);
  alloc_->wake_pool(7);
  EXPECT_EQ(sim::call_count(driver::EntryPoint::memset_d8_async), memsets1);
  free_all(blocks);
  alloc_->release_pool(7);
}

TEST_F(PoolSleepTest, AFailedZeroingLeavesThePoolAsleepAndALaterWakeZeroes) {
  alloc_->create_pool(10);
  const auto blocks = fill_pool(10);
  ASSERT_TRUE(alloc_->sleep_pool(10, Mode::discard_zeroed));
  for (uint64_t nth = 1; nth <= 3; ++nth) {
    sim::inject_failure(driver::EntryPoint::memset_d8_async, nth, CUDA_ERROR_LAUNCH_FAILED);
    bool failed = false;
    try {
      alloc_->wake_pool(10);
    } catch (const driver_failure&) {
      failed = true;
    }
    sim::clear_injections();
    EXPECT_EQ(books_vs_driver(), "") << "nth " << nth;
    if (!failed) {
      ASSERT_TRUE(alloc_->sleep_pool(10, Mode::discard_zeroed));
      continue;
    }
    EXPECT_TRUE(alloc_->pool_is_asleep(10)) << "nth " << nth;
  }
  alloc_->wake_pool(10);
  for (const Held& h : blocks) {
    const auto* b = static_cast<const unsigned char*>(h.p);
    EXPECT_EQ(std::count(b, b + h.n, 0), static_cast<std::ptrdiff_t>(h.n)) << "block " << h.p;
  }
  free_all(blocks);
  alloc_->release_pool(10);
}

TEST_F(PoolSleepTest, AdjacentBlocksGoInOneCopyEachWay) {
  alloc_->create_pool(8);
  // 64 small blocks back to back (a model's biases), one freed in the middle: two runs.
  std::vector<Held> blocks;
  for (uint64_t i = 0; i < 64; ++i) {
    void* p = alloc_->allocate(4096, nullptr, 8);
    fill_pattern(p, 4096, 500 + i);
    blocks.push_back({p, 4096, 500 + i});
  }
  for (size_t i = 1; i < blocks.size(); ++i) {
    ASSERT_EQ(static_cast<char*>(blocks[i].p), static_cast<char*>(blocks[i - 1].p) + 4096)
        << "the pool places them back to back";
  }
  alloc_->deallocate(blocks[32].p, nullptr);
  blocks.erase(blocks.begin() + 32);
  const uint64_t out0 = sim::call_count(driver::EntryPoint::memcpy_dtoh_async);
  const uint64_t in0 = sim::call_count(driver::EntryPoint::memcpy_htod_async);
  ASSERT_TRUE(alloc_->sleep_pool(8, Mode::offload));
  EXPECT_EQ(sim::call_count(driver::EntryPoint::memcpy_dtoh_async) - out0, 2u);
  // A block freed while asleep splits a run at wake too.
  alloc_->deallocate(blocks[10].p, nullptr);
  blocks.erase(blocks.begin() + 10);
  alloc_->wake_pool(8);
  EXPECT_EQ(sim::call_count(driver::EntryPoint::memcpy_htod_async) - in0, 3u);
  expect_intact(blocks);
  free_all(blocks);
  alloc_->release_pool(8);
}

TEST_F(PoolSleepTest, StatsSayWhatWentBackAndWhatItCost) {
  alloc_->create_pool(9);
  const auto blocks = fill_pool(9);
  const size_t physical = alloc_->pool_stats(9).physical_bytes;
  EXPECT_EQ(alloc_->pool_stats(9).cycles.sleeps, 0u);
  ASSERT_TRUE(alloc_->sleep_pool(9, Mode::offload));
  core::PoolStats s = alloc_->pool_stats(9);
  EXPECT_EQ(s.cycles.sleeps, 1u);
  EXPECT_EQ(s.cycles.released_bytes, physical);
  EXPECT_GT(s.cycles.sleep_modeled_ns, 0.0);
  EXPECT_EQ(s.cycles.wake_modeled_ns, 0.0) << "not woken yet";
  alloc_->wake_pool(9);
  s = alloc_->pool_stats(9);
  EXPECT_GT(s.cycles.wake_modeled_ns, 0.0);
  EXPECT_GT(s.cycles.wake_wall_ns, 0u);
  ASSERT_TRUE(alloc_->sleep_pool(9, Mode::discard));
  EXPECT_EQ(alloc_->pool_stats(9).cycles.sleeps, 2u);
  alloc_->wake_pool(9);
  free_all(blocks);
  alloc_->release_pool(9);
}

TEST_F(PoolSleepTest, AHundredCyclesGrowNothing) {
  alloc_->create_pool(4);
  const auto blocks = fill_pool(4);
  alloc_->sleep_pool(4, Mode::offload);
  alloc_->wake_pool(4);
  const core::DeviceStats s0 = alloc_->stats();
  const size_t backup0 = alloc_->pool_stats(4).host_backup_bytes;
  for (int i = 0; i < 100; ++i) {
    alloc_->sleep_pool(4, Mode::offload);
    alloc_->wake_pool(4);
  }
  const core::DeviceStats s1 = alloc_->stats();
  EXPECT_EQ(s1.physical_bytes, s0.physical_bytes);
  EXPECT_EQ(s1.va_reserved_bytes, s0.va_reserved_bytes);
  EXPECT_EQ(alloc_->pool_stats(4).host_backup_bytes, backup0);
  expect_intact(blocks);
  EXPECT_EQ(books_vs_driver(), "");
  free_all(blocks);
  alloc_->release_pool(4);
  // A released pool keeps its staging until asked (freeing pinned memory synchronizes, which
  // must not happen beside a capture): release_host_backup gives it back, once.
  EXPECT_EQ(alloc_->release_host_backup(), backup0);
  EXPECT_EQ(alloc_->release_host_backup(), 0u);
}

TEST_F(PoolSleepTest, SleepIsRefusedUnderAnAnnouncedCaptureAndChangesNothing) {
  alloc_->create_pool(5);
  const auto blocks = fill_pool(5);
  core::CaptureAnnouncements::begin(alloc_->driver().primary());
  EXPECT_FALSE(alloc_->sleep_pool(5, Mode::offload));
  core::CaptureAnnouncements::end(alloc_->driver().primary());
  EXPECT_FALSE(alloc_->pool_is_asleep(5));
  expect_intact(blocks);
  free_all(blocks);
  alloc_->release_pool(5);
}

TEST_F(PoolSleepTest, HeldStreamWorkIsDoneBeforeAnyPageGoes) {
  alloc_->create_pool(6);
  CUstream s = new_stream();
  void* p = alloc_->allocate(4 * P, s, 6);
  sim::hold_stream(s);
  {  // work on s that uses the block and has not completed
    PrimaryCtx c(drv_->table());
    CUevent e = nullptr;
    drv_->table().event_create(&e, 0);
    drv_->table().event_record(e, s);
    EXPECT_EQ(drv_->table().event_query(e), CUDA_ERROR_NOT_READY);
    alloc_->sleep_pool(6, Mode::discard);
    EXPECT_EQ(drv_->table().event_query(e), CUDA_SUCCESS) << "pages went under pending work";
    drv_->table().event_destroy(e);
  }
  alloc_->wake_pool(6);
  alloc_->deallocate(p, s);
  alloc_->release_pool(6);
}

// Blocks of an asleep pool that another stream used, freed while asleep, wait for that stream
// (pending). The wake polls while it maps the first (reclaim first: it looks for pages under free
// memory before creating); the poll proves them, and they merge into one free block: the wake
// must map that block whole, not walk the blocks the merge erased (a read of freed memory, which
// ASan reports).
TEST_F(PoolSleepTest, PendingFreesThatMergeDuringTheWakeAreMappedWhole) {
  core::AllocatorOptions o;
  o.reclaim_before_create = true;
  make(sim_config(32 * P), o);
  alloc_->create_pool(7);
  CUstream other = new_stream();
  void* b[4];
  for (int i = 0; i < 4; ++i) {
    b[i] = alloc_->allocate(P, nullptr, 7);
    alloc_->record_stream(b[i], other);
  }
  void* keep = alloc_->allocate(P, nullptr, 7);
  fill_pattern(keep, P, 5);
  for (int i = 1; i < 4; ++i) {
    ASSERT_EQ(static_cast<char*>(b[i]), static_cast<char*>(b[0]) + i * P) << "block " << i;
  }
  ASSERT_TRUE(alloc_->sleep_pool(7, Mode::offload));
  for (int i = 0; i < 4; ++i) alloc_->deallocate(b[i], nullptr);
  // A call on the other stream records the fence that proves its uses over; the stream is held
  // meanwhile, so only a later poll (the wake's) finds it done.
  sim::hold_stream(other);
  alloc_->deallocate(alloc_->allocate(512, other), other);
  sim::release_stream(other);
  alloc_->wake_pool(7);
  EXPECT_EQ(books_vs_driver(), "");
  EXPECT_EQ(check_pattern(keep, P, 5), SIZE_MAX);
  // The freed memory is the pool's again, mapped: a block of all four pages fits there.
  void* all = alloc_->allocate(4 * P, nullptr, 7);
  EXPECT_EQ(all, b[0]);
  fill_pattern(all, 4 * P, 6);
  EXPECT_EQ(check_pattern(all, 4 * P, 6), SIZE_MAX);
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->deallocate(all, nullptr);
  alloc_->deallocate(keep, nullptr);
  alloc_->release_pool(7);
}

// A driver failure at the nth call of each entry point a sleep or wake makes.
// Random pools of blocks of every size, some default blocks between them, frees while asleep,
// the default pool churning meanwhile, offload or zeroed discard; with no option, a reservation,
// thread caches: every byte comes back (or zeros), and the books agree with the driver.
TEST_F(PoolSleepTest, RandomPoolsComeBackWhole) {
  for (const char* text : {"", "reserve:40MiB", "thread_cache:16MiB"}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE(std::string("conf '") + text + "' seed " + std::to_string(seed));
      make(sim_config(64 * MiB), conf::options_for_device(conf::parse_config(text), 64 * MiB));
      core::DeviceAllocator& a = *alloc_;
      std::mt19937_64 rng(seed);
      a.create_pool(1);
      struct H {
        void* p;
        size_t n;
        uint64_t s;
        bool pool;
      };
      std::vector<H> hs;
      for (uint64_t i = 0; i < 12; ++i) {
        const bool pool = rng() % 3 != 0;
        const size_t n = rng() % 2 ? 512 + rng() % 8192 : 1 + rng() % (3 * MiB);
        void* p = a.allocate(n, nullptr, pool ? 1 : 0);
        fill_pattern(p, n, seed * 100 + i);
        hs.push_back({p, n, seed * 100 + i, pool});
      }
      for (H& h : hs) {
        if (!h.pool && rng() % 2) {
          a.deallocate(h.p, nullptr);
          h.n = 0;
        }
      }
      const Mode mode = rng() % 2 ? Mode::offload : Mode::discard_zeroed;
      ASSERT_TRUE(a.sleep_pool(1, mode));
      for (H& h : hs) {
        if (h.pool && h.n != 0 && rng() % 4 == 0) {
          a.deallocate(h.p, nullptr);
          h.n = 0;
        }
      }
      for (uint64_t i = 0; i < 6; ++i) {
        const size_t n = 1 + rng() % (4 * MiB);
        try {
          void* p = a.allocate(n, nullptr);
          fill_pattern(p, n, 7777 + i);
          hs.push_back({p, n, 7777 + i, false});
          if (rng() % 2) {
            a.deallocate(p, nullptr);
            hs.back().n = 0;
          }
        } catch (const out_of_memory&) {
          // The device is small: the pool's pages serve others while it sleeps.
        }
      }
      try {
        a.wake_pool(1);
      } catch (const out_of_memory&) {
        for (const H& h : hs) {
          if (h.n != 0 && !h.pool) a.deallocate(h.p, nullptr);
        }
        a.wake_pool(1);  // the others' memory gone, the pool's pages are there again
        for (H& h : hs) {
          if (!h.pool) h.n = 0;
        }
      }
      EXPECT_EQ(books_vs_driver(), "");
      for (const H& h : hs) {
        if (h.n == 0) continue;
        if (h.pool && mode == Mode::discard_zeroed) {
          const auto* b = static_cast<const unsigned char*>(h.p);
          EXPECT_EQ(std::count(b, b + h.n, 0), static_cast<std::ptrdiff_t>(h.n)) << "not zeroed";
        } else {
          EXPECT_EQ(check_pattern(h.p, h.n, h.s), SIZE_MAX)
              << (h.pool ? "pool" : "default") << " block " << h.p << " of " << h.n;
        }
        a.deallocate(h.p, nullptr);
      }
    }
  }
}

class PoolSleepFailureTest : public PoolSleepTest,
                             public ::testing::WithParamInterface<driver::EntryPoint> {};

TEST_P(PoolSleepFailureTest, AFailedSleepLeavesThePoolAwakeWithItsBytes) {
  for (uint64_t nth = 1; nth <= 4; ++nth) {
    alloc_->create_pool(100 + nth);
    const auto blocks = fill_pool(100 + nth, nth * 10);
    sim::inject_failure(GetParam(), nth, CUDA_ERROR_OUT_OF_MEMORY);
    bool failed = false;
    try {
      failed = !alloc_->sleep_pool(100 + nth, Mode::offload);  // false: the synchronize failed
    } catch (const driver_failure&) {
      failed = true;
    }
    sim::clear_injections();
    EXPECT_EQ(books_vs_driver(), "") << "nth " << nth;
    if (failed) {
      EXPECT_FALSE(alloc_->pool_is_asleep(100 + nth)) << "nth " << nth;
    } else {
      alloc_->wake_pool(100 + nth);
    }
    expect_intact(blocks);
    free_all(blocks);
    alloc_->release_pool(100 + nth);
    alloc_->release_cached();
  }
}

TEST_P(PoolSleepFailureTest, AFailedWakeLeavesThePoolAsleepAndALaterWakeWorks) {
  for (uint64_t nth = 1; nth <= 4; ++nth) {
    alloc_->create_pool(200 + nth);
    const auto blocks = fill_pool(200 + nth, nth * 10);
    alloc_->sleep_pool(200 + nth, Mode::offload);
    sim::inject_failure(GetParam(), nth, CUDA_ERROR_OUT_OF_MEMORY);
    bool failed = false;
    try {
      alloc_->wake_pool(200 + nth);
    } catch (const driver_failure&) {
      failed = true;
    } catch (const out_of_memory&) {
      failed = true;
    }
    sim::clear_injections();
    EXPECT_EQ(books_vs_driver(), "") << "nth " << nth;
    if (failed) {
      EXPECT_TRUE(alloc_->pool_is_asleep(200 + nth)) << "nth " << nth;
      alloc_->wake_pool(200 + nth);
    }
    expect_intact(blocks);
    free_all(blocks);
    alloc_->release_pool(200 + nth);
    alloc_->release_cached();
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryEntryPoint, PoolSleepFailureTest,
    ::testing::Values(driver::EntryPoint::mem_host_alloc, driver::EntryPoint::memcpy_dtoh_async,
                      driver::EntryPoint::memcpy_htod_async,
                      driver::EntryPoint::stream_synchronize, driver::EntryPoint::stream_create,
                      driver::EntryPoint::mem_unmap, driver::EntryPoint::mem_release,
                      driver::EntryPoint::mem_create, driver::EntryPoint::mem_map,
                      driver::EntryPoint::mem_set_access, driver::EntryPoint::ctx_synchronize),
    entry_point_param_name);

}  // namespace
}  // namespace expanse::test
