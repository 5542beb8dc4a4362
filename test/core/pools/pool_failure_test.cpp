// Invariant 4 with pools: the Nth call of a driver entry point fails while a sequence with pools
// runs (create, release, allocations in pools and the default pool, frees joining pools,
// trim_pool, release_cached). After every operation: check_invariants() is "", the books match
// the driver's (mapped, physical, reserved bytes), every live block keeps its data, each pool's
// stats match the model, no allocation in one pool overlaps memory of another pool that is not
// returned, and once the injections stop everything works and all memory can be given back.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"
#include "range_set.hpp"

#include <map>
#include <random>

namespace expanse::test {
namespace {

using driver::EntryPoint;

struct PoolInjection {
  EntryPoint entry;
  CUresult code;
};

class PoolFailureInjectionTest : public CoreTest,
                                 public ::testing::WithParamInterface<PoolInjection> {};

TEST_P(PoolFailureInjectionTest, FailingNthCallWithPoolsLeavesAConsistentAllocator) {
  const PoolInjection inj = GetParam();
  make(sim_config(256 * MiB));  // 128 pages: pressure, so reclaim and returns run
  const size_t P = alloc_->page_size();
  CUstream s1 = new_stream(), s2 = new_stream();
  std::mt19937_64 rng(static_cast<uint64_t>(inj.entry) * 131 + 17);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  struct Live {
    size_t n;
    uint64_t seed;
    uint64_t pool;
    CUstream stream;
  };
  struct Pool {
    int use = 1;
    bool returned = false;
    size_t live_blocks = 0, requested = 0;
    RangeSet ranges;
    RangeSet hull;  // with each allocated block's whole pages (a pool takes whole pages)
  };
  std::map<uintptr_t, Live> live;
  std::map<uint64_t, Pool> pools;
  uint64_t next_id = 1;
  size_t failures = 0, ooms = 0, trims_refused = 0, pool_allocs = 0, fired = 0;
  const uint64_t calls_before = sim::call_count(inj.entry);

  auto live_pools = [&]() {
    std::vector<uint64_t> v;
    for (const auto& [id, p] : pools) {
      if (p.use > 0) v.push_back(id);
    }
    return v;
  };
  auto check = [&](const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(books_vs_driver(), "");
    for (const auto& [a, b] : live) {
      ASSERT_EQ(check_pattern(reinterpret_cast<void*>(a), b.n, b.seed), SIZE_MAX)
          << "block " << reinterpret_cast<void*>(a) << " of pool " << b.pool << " lost its data";
    }
    for (auto it = pools.begin(); it != pools.end();) {
      const uint64_t id = it->first;
      Pool& mp = it->second;
      if (!alloc_->has_pool(id)) {
        ASSERT_EQ(mp.use, 0) << "pool " << id << " in use was forgotten";
        ASSERT_EQ(mp.live_blocks, 0u) << "pool " << id << " forgotten with live blocks";
        it = pools.erase(it);
        continue;
      }
      const core::PoolStats st = alloc_->pool_stats(id);
      ASSERT_EQ(st.use_count, mp.use) << "pool " << id;
      ASSERT_EQ(st.live_blocks, mp.live_blocks) << "pool " << id;
      ASSERT_EQ(st.requested_bytes, mp.requested) << "pool " << id;
      if (st.returned) {
        ASSERT_EQ(mp.use, 0) << "pool " << id;
        ASSERT_EQ(st.cached_bytes, 0u) << "pool " << id;
        mp.returned = true;
        mp.ranges.clear();
        mp.hull.clear();
      } else {
        ASSERT_GE(st.cached_bytes + st.live_bytes, mp.ranges.bytes()) << "pool " << id;
        ASSERT_LE(st.cached_bytes + st.live_bytes, mp.hull.bytes()) << "pool " << id;
      }
      ++it;
    }
  };

  for (uint64_t nth = 1; nth <= 40; ++nth) {
    sim::inject_failure(inj.entry, nth % 7 + 1, inj.code);
    const uint64_t armed_at = sim::call_count(inj.entry);
    for (int op = 0; op < 30; ++op) {
      const std::string where = "nth " + std::to_string(nth) + ", op " + std::to_string(op);
      const std::vector<uint64_t> lp = live_pools();
      const size_t dice = pick(100);
      if (dice < 6 && lp.size() < 4) {
        alloc_->create_pool(next_id);
        pools.emplace(next_id++, Pool{});
      } else if (dice < 12 && !lp.empty()) {
        const uint64_t id = lp[pick(lp.size())];
        alloc_->release_pool(id);  // no driver call: never fails
        --pools[id].use;
      } else if (dice < 16) {
        std::vector<uint64_t> rel;
        for (const auto& [id, p] : pools) {
          if (p.use == 0 && !p.returned) rel.push_back(id);
        }
        if (!rel.empty()) {
          const uint64_t id = rel[pick(rel.size())];
          try {
            if (!alloc_->trim_pool(id)) ++trims_refused;  // the synchronize failed: unchanged
          } catch (const driver_failure& e) {
            ++failures;
            EXPECT_NE(std::string(e.what()).find("pool " + std::to_string(id)), std::string::npos)
                << e.what();
          }
        }
      } else if (dice < 18) {
        try {
          alloc_->release_cached();
        } catch (const driver_failure&) {
          ++failures;
        }
      } else if (dice < 62 || live.empty()) {
        const size_t n = 512 + pick(pick(4) == 0 ? 24 * P : 3 * P);
        const uint64_t target = !lp.empty() && pick(2) == 0 ? lp[pick(lp.size())] : 0;
        CUstream s = pick(2) != 0 ? s1 : s2;
        const uint64_t seed = nth * 1000 + static_cast<uint64_t>(op);
        try {
          void* p = alloc_->allocate(n, s, target);
          const auto a = reinterpret_cast<uintptr_t>(p);
          const size_t sz = (n + 511) / 512 * 512;
          for (const auto& [id, mp] : pools) {
            if (id == target || mp.returned) continue;
            if (!alloc_->has_pool(id) || alloc_->pool_stats(id).returned) continue;
            ASSERT_FALSE(mp.ranges.overlaps(a, a + sz))
                << where << ": allocate(" << n << ", pool " << target << ") at " << p
                << " overlaps memory of pool " << id << ", not returned";
          }
          fill_pattern(p, n, seed);
          live.emplace(a, Live{n, seed, target, s});
          if (target != 0) {
            Pool& mp = pools[target];
            ++mp.live_blocks;
            mp.requested += n;
            mp.ranges.add(a, a + sz);
            mp.hull.add(a / P * P, (a + sz + P - 1) / P * P);
            ++pool_allocs;
          }
        } catch (const driver_failure& e) {
          ++failures;
          EXPECT_NE(std::string(e.what()).find(driver::entry_point_name(inj.entry)),
                    std::string::npos)
              << e.what();
        } catch (const out_of_memory&) {
          ++ooms;  // capacity reached, or cuMemCreate "ran out": fine if all stays consistent
        }
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(pick(live.size())));
        const uintptr_t a = it->first;
        const Live b = it->second;
        const uint64_t join = b.pool == 0 && !lp.empty() && pick(3) == 0 ? lp[pick(lp.size())] : 0;
        if (pick(4) == 0) alloc_->record_stream(reinterpret_cast<void*>(a), s2);
        try {
          alloc_->deallocate(reinterpret_cast<void*>(a), pick(2) != 0 ? b.stream : s1, 0, join);
          live.erase(it);
          if (b.pool != 0) {
            Pool& mp = pools.at(b.pool);
            --mp.live_blocks;
            mp.requested -= b.n;
          } else if (join != 0) {
            pools.at(join).ranges.add(a, a + (b.n + 511) / 512 * 512);
            pools.at(join).hull.add(a, a + (b.n + 511) / 512 * 512);
          }
        } catch (const driver_failure&) {
          ++failures;  // the block stays live and usable
        }
      }
      check(where);
      if (HasFatalFailure()) return;
    }
    if (sim::call_count(inj.entry) - armed_at >= nth % 7 + 1) ++fired;
  }
  sim::clear_injections();
  const uint64_t calls = sim::call_count(inj.entry) - calls_before;
  std::printf(
      "%s: %llu calls, %zu of 40 injections fired; %zu driver failures, %zu OOMs, %zu refused "
      "trims, %zu pool allocations\n",
      driver::entry_point_name(inj.entry), static_cast<unsigned long long>(calls), fired, failures,
      ooms, trims_refused, pool_allocs);
  // (Failed event records and queries are absorbed: the allocator waits instead.)
  EXPECT_GT(fired, 0u) << "the injected failure never fired; the sequence tests too little";
  EXPECT_GT(pool_allocs, 0u);

  // Afterwards everything works again and everything can be given back.
  for (const auto& [a, b] : live) alloc_->deallocate(reinterpret_cast<void*>(a), b.stream);
  for (auto& [id, mp] : pools) {
    for (; mp.use > 0; --mp.use) alloc_->release_pool(id);
  }
  alloc_->release_cached();
  for (const auto& [id, mp] : pools) EXPECT_FALSE(alloc_->has_pool(id)) << "pool " << id;
  void* p = alloc_->allocate(128 * P, s1);  // the whole device
  ASSERT_NE(p, nullptr);
  alloc_->deallocate(p, s1);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");
}

INSTANTIATE_TEST_SUITE_P(
    DriverEntryPoints, PoolFailureInjectionTest,
    ::testing::Values(PoolInjection{EntryPoint::mem_create, CUDA_ERROR_OUT_OF_MEMORY},
                      PoolInjection{EntryPoint::mem_create, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::mem_map, CUDA_ERROR_INVALID_VALUE},
                      PoolInjection{EntryPoint::mem_set_access, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::mem_unmap, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::mem_release, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::mem_address_reserve, CUDA_ERROR_OUT_OF_MEMORY},
                      PoolInjection{EntryPoint::event_record, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::event_query, CUDA_ERROR_UNKNOWN},
                      PoolInjection{EntryPoint::ctx_synchronize, CUDA_ERROR_UNKNOWN}),
    [](const ::testing::TestParamInfo<PoolInjection>& p) {
      return std::string(driver::entry_point_name(p.param.entry)) + "_" +
             std::to_string(static_cast<int>(p.param.code));
    });

}  // namespace
}  // namespace expanse::test
