// Pools (src/core/pool_table.hpp) against a reference model: random sequences of create, retain,
// release, allocate (default pool or a live pool), free (sometimes joining a live pool, as a free
// during a capture does), trim_pool, release_cached, held streams, on a small device (64 pages)
// so that pressure and returns happen. Checked after every step:
//   - isolation: while a pool is not returned (its use count is above 0, or it is released but
//     no synchronize has proven its work done yet), no allocation in another pool (the default
//     included) overlaps any address range its blocks occupied since it was created, nor is any
//     page under those ranges remapped (the handle at every such page stays the same);
//   - invariant 1 with pools: an allocation of n bytes fails only when
//     ceil(n / page) + 2 > capacity pages - |pages touched by live blocks U pages under the
//     memory of pools whose use count is above 0| (a live pool's own free memory is never
//     unmapped, even for itself, so it counts as unavailable to every allocation);
//   - per-pool stats exact (live blocks, requested and carved bytes, use count), cached bytes +
//     live bytes equal to the bytes of the model's ranges while the pool is not returned, and
//     cached bytes 0 once it is;
//   - no data loss (patterns in every live block), check_invariants() == "", device stats exact.
// EXPANSE_POOL_PROPERTY_OPS sets the number of steps per seed (default 8000; 100000 in the soak).
#include "core_fixture.hpp"
#include "expanse/errors.hpp"
#include "range_set.hpp"
#include "reference_model.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <unordered_set>

namespace expanse::test {
namespace {

size_t pool_ops_from_env(size_t dflt) {
  const char* s = std::getenv("EXPANSE_POOL_PROPERTY_OPS");
  return s != nullptr ? static_cast<size_t>(std::strtoull(s, nullptr, 10)) : dflt;
}

struct PoolBlock {
  uint64_t pool;  // the pool it was allocated in (0: default)
};

struct ModelPool {
  int use = 1;
  bool returned = false;  // observed through pool_stats / has_pool
  size_t live_blocks = 0, requested = 0, live_bytes = 0;
  RangeSet ranges;  // every range its blocks occupied (allocated in it, or joined it)
  // The same with each allocated block's whole pages: a pool takes whole pages from the default
  // pool, so its memory lies between `ranges` and `hull` (a block placed in a joined block's
  // memory need not own its pages).
  RangeSet hull;
  std::map<uint64_t, CUmemGenericAllocationHandle> pages;  // page index -> handle mapped there
};

class PoolPropertyTest : public CoreTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(PoolPropertyTest, RandomPoolOperationsKeepPoolsApart) {
  const uint64_t seed = GetParam();
  const size_t capacity = 64 * 2 * MiB;
  make(sim_config(capacity));
  const size_t P = alloc_->page_size();
  ASSERT_EQ(P, 2 * MiB);
  const size_t cap_pages = capacity / P;
  ReferenceModel model(P, capacity);
  std::map<uintptr_t, PoolBlock> owner;  // live block -> its pool
  std::map<uint64_t, ModelPool> pools;   // pools not yet forgotten
  std::set<uint64_t> dead;               // pools forgotten
  uint64_t next_id = 1000 * seed + 1;
  CUstream s1 = new_stream();
  std::vector<CUstream> streams = {nullptr, s1};
  std::mt19937_64 rng(seed);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  auto live_pools = [&]() {
    std::vector<uint64_t> v;
    for (const auto& [id, p] : pools) {
      if (p.use > 0) v.push_back(id);
    }
    return v;
  };
  auto released_unreturned = [&]() {
    std::vector<uint64_t> v;
    for (const auto& [id, p] : pools) {
      if (p.use == 0 && !p.returned) v.push_back(id);
    }
    return v;
  };
  auto record_pages = [&](ModelPool& mp, uintptr_t a, size_t size) {
    for (uint64_t pg = a / P; pg <= (a + size - 1) / P; ++pg) {
      if (mp.pages.count(pg) == 0) mp.pages.emplace(pg, handle_at(pg * P));
    }
  };
  // Pages nothing may take now: touched by live blocks, or under a live pool's memory.
  auto unavailable_pages = [&]() {
    std::unordered_set<uint64_t> pages;
    for (const auto& [a, b] : model.live()) {
      for (uint64_t pg = a / P; pg <= (a + b.size - 1) / P; ++pg) pages.insert(pg);
    }
    for (const auto& [id, p] : pools) {
      if (p.use == 0) continue;
      for (const auto& [a, b] : p.hull.ranges()) {
        for (uint64_t pg = a / P; pg <= (b - 1) / P; ++pg) pages.insert(pg);
      }
    }
    return pages.size();
  };
  auto where = [&](size_t step) {
    std::ostringstream o;
    o << "seed " << seed << ", step " << step;
    return o.str();
  };

  const size_t ops = pool_ops_from_env(8000);
  size_t n_create = 0, n_alloc = 0, n_pool_alloc = 0, n_oom = 0, n_pool_oom = 0, n_free = 0,
         n_join = 0, n_trim = 0, n_returned = 0, n_forgotten = 0, n_release_cached = 0,
         n_near_bound_oom = 0, n_reuse_in_pool = 0;
  for (size_t step = 0; step < ops; ++step) {
    SCOPED_TRACE(where(step));
    const size_t dice = pick(1000);
    const std::vector<uint64_t> lp = live_pools();
    // Pools churn: at most 4 in use and 12 known at once, use counts up to 3.
    if (dice < 40 && lp.size() < 4 && pools.size() < 12) {
      const uint64_t id = next_id++;
      alloc_->create_pool(id);
      pools.emplace(id, ModelPool{});
      ++n_create;
    } else if (dice < 60 && !lp.empty() && pools[lp[0]].use < 3) {
      const uint64_t id = lp[0];
      alloc_->retain_pool(id);
      ++pools[id].use;
    } else if (dice < 100 && !lp.empty()) {
      const uint64_t id = lp[pick(lp.size())];
      alloc_->release_pool(id);
      --pools[id].use;
    } else if (dice < 520 || model.live().empty()) {
      size_t n;
      const size_t kind = pick(100);
      if (kind < 70) {
        n = 512 + log_uniform_size(rng, 21);
      } else if (kind < 95) {
        n = P + pick(3 * P);
      } else {
        n = 4 * P + pick(8 * P);
      }
      const uint64_t target = !lp.empty() && pick(2) == 0 ? lp[pick(lp.size())] : 0;
      CUstream s = streams[pick(streams.size())];
      const size_t avail = model.avail();
      const size_t avail_pools = cap_pages - std::min(cap_pages, unavailable_pages());
      void* p = nullptr;
      try {
        p = alloc_->allocate(n, s, target);
      } catch (const out_of_memory& e) {
        ASSERT_GT(model.pages_for(n) + 2, avail_pools)
            << where(step) << ": allocate(" << n << ", pool " << target << ") failed although "
            << avail_pools << " pages are neither touched nor under a live pool's memory: "
            << e.what();
        if (model.pages_for(n) <= avail_pools) ++n_near_bound_oom;
        model.oom();
        ++n_oom;
        if (target != 0) ++n_pool_oom;
      }
      if (p != nullptr) {
        const auto a = reinterpret_cast<uintptr_t>(p);
        const size_t sz = (n + 511) / 512 * 512;
        ASSERT_EQ(a % 512, 0u);
        ASSERT_EQ(model.placement_error(a, sz, avail), "")
            << where(step) << ": allocate(" << n << ", pool " << target << ") at " << p;
        fill_pattern(p, n, step * 7 + seed);
        model.add(a, ModelBlock{n, sz, s, step * 7 + seed});
        owner.emplace(a, PoolBlock{target});
        if (target != 0) {
          ModelPool& mp = pools[target];
          if (mp.ranges.overlaps(a, a + sz)) ++n_reuse_in_pool;
          ++mp.live_blocks;
          mp.requested += n;
          mp.live_bytes += sz;
          mp.ranges.add(a, a + sz);
          mp.hull.add(a / P * P, (a + sz + P - 1) / P * P);
          record_pages(mp, a, sz);
          ++n_pool_alloc;
        }
        ++n_alloc;
      }
      // Isolation. An allocation that would fail otherwise may return released pools first:
      // those returned during it lose their protection; every other pool keeps it.
      if (p != nullptr) {
        const auto a = reinterpret_cast<uintptr_t>(p);
        const size_t sz = (n + 511) / 512 * 512;
        for (auto& [id, mp] : pools) {
          if (id == target || mp.returned) continue;
          bool returned_now = !alloc_->has_pool(id) || alloc_->pool_stats(id).returned;
          if (returned_now) continue;
          ASSERT_FALSE(mp.ranges.overlaps(a, a + sz))
              << where(step) << ": allocate(" << n << ", pool " << target << ") at " << p
              << " overlaps memory of pool " << id << " (use count " << mp.use
              << "), which is not returned";
        }
      }
    } else if (dice < 870) {
      auto it = model.live().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(model.live().size())));
      const uintptr_t a = it->first;
      const ModelBlock b = it->second;
      const uint64_t from = owner.at(a).pool;
      CUstream s = pick(5) == 0 ? streams[pick(streams.size())] : b.stream;
      uint64_t join = 0;
      if (pick(3) == 0) {
        const std::vector<uint64_t> rel = released_unreturned();
        if (!lp.empty() && pick(4) != 0) {
          join = lp[pick(lp.size())];
        } else if (!rel.empty()) {
          join = rel[pick(rel.size())];  // not in use: the block stays the default pool's
        }
      }
      alloc_->deallocate(reinterpret_cast<void*>(a), s, pick(2) == 0 ? b.requested : 0, join);
      model.remove(a);
      owner.erase(a);
      if (from != 0) {
        ModelPool& mp = pools.at(from);
        --mp.live_blocks;
        mp.requested -= b.requested;
        mp.live_bytes -= b.size;
      } else if (join != 0 && pools.at(join).use > 0) {
        ModelPool& mp = pools.at(join);
        mp.ranges.add(a, a + b.size);
        mp.hull.add(a, a + b.size);
        record_pages(mp, a, b.size);
        ++n_join;
      }
      ++n_free;
    } else if (dice < 900) {
      const std::vector<uint64_t> rel = released_unreturned();
      if (!rel.empty() && pick(4) != 0) {
        const uint64_t id = rel[pick(rel.size())];
        ASSERT_TRUE(alloc_->trim_pool(id)) << where(step) << ": trim_pool(" << id << ")";
        ++n_trim;
        ASSERT_EQ(books_vs_driver(), "") << where(step) << " after trim_pool(" << id << ")";
      } else if (!lp.empty()) {
        const uint64_t id = lp[pick(lp.size())];
        const core::DeviceStats before = alloc_->stats();
        const core::PoolStats pbefore = alloc_->pool_stats(id);
        try {
          alloc_->trim_pool(id);
          ADD_FAILURE() << where(step) << ": trim_pool of pool " << id << " in use did not throw";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("pool " + std::to_string(id)), std::string::npos)
              << e.what();
        }
        const core::DeviceStats after = alloc_->stats();
        ASSERT_EQ(before.mapped_bytes, after.mapped_bytes);
        ASSERT_EQ(before.physical_bytes, after.physical_bytes);
        ASSERT_EQ(pbefore.cached_bytes, alloc_->pool_stats(id).cached_bytes);
      }
    } else if (dice < 910) {
      alloc_->release_cached();
      ++n_release_cached;
      // Every released pool is returned now.
      for (auto& [id, mp] : pools) {
        if (mp.use == 0 && alloc_->has_pool(id)) {
          ASSERT_TRUE(alloc_->pool_stats(id).returned) << where(step) << ": pool " << id;
        }
      }
    } else if (dice < 940) {
      sim::hold_stream(s1);
    } else if (dice < 980) {
      sim::release_stream(s1);
    } else {
      // Misuse changes nothing: allocate into / retain a released or forgotten pool, create an
      // id used before.
      std::vector<uint64_t> gone(dead.begin(), dead.end());
      for (uint64_t id : released_unreturned()) gone.push_back(id);
      for (const auto& [id, mp] : pools) {
        if (mp.use == 0 && mp.returned) gone.push_back(id);
      }
      const core::DeviceStats before = alloc_->stats();
      if (!gone.empty()) {
        const uint64_t id = gone[pick(gone.size())];
        EXPECT_THROW(alloc_->allocate(4096, nullptr, id), usage_error) << "pool " << id;
        EXPECT_THROW(alloc_->retain_pool(id), usage_error) << "pool " << id;
        EXPECT_THROW(alloc_->create_pool(id), usage_error) << "pool " << id;
      }
      if (!pools.empty()) {
        EXPECT_THROW(alloc_->create_pool(pools.begin()->first), usage_error);
      }
      const core::DeviceStats after = alloc_->stats();
      ASSERT_EQ(before.live_blocks, after.live_blocks);
      ASSERT_EQ(before.num_allocs, after.num_allocs);
    }

    // ---- observe the pools: returns, forgetting, exact stats ----
    for (auto it = pools.begin(); it != pools.end();) {
      const uint64_t id = it->first;
      ModelPool& mp = it->second;
      if (!alloc_->has_pool(id)) {
        ASSERT_EQ(mp.use, 0) << where(step) << ": pool " << id << " in use was forgotten";
        ASSERT_EQ(mp.live_blocks, 0u)
            << where(step) << ": pool " << id << " was forgotten with live blocks";
        if (!mp.returned) ++n_returned;
        ++n_forgotten;
        dead.insert(id);
        it = pools.erase(it);
        continue;
      }
      const core::PoolStats st = alloc_->pool_stats(id);
      ASSERT_EQ(st.id, id);
      ASSERT_EQ(st.use_count, mp.use) << where(step) << ": pool " << id;
      ASSERT_EQ(st.live_blocks, mp.live_blocks) << where(step) << ": pool " << id;
      ASSERT_EQ(st.requested_bytes, mp.requested) << where(step) << ": pool " << id;
      ASSERT_EQ(st.live_bytes, mp.live_bytes) << where(step) << ": pool " << id;
      if (mp.use > 0) {
        ASSERT_FALSE(st.returned) << where(step) << ": pool " << id;
      }
      if (mp.returned) {
        ASSERT_TRUE(st.returned) << where(step) << ": pool " << id;
      }
      if (st.returned && !mp.returned) {
        mp.returned = true;
        mp.ranges.clear();
        mp.hull.clear();
        mp.pages.clear();
        ++n_returned;
      }
      if (mp.returned) {
        ASSERT_EQ(st.cached_bytes, 0u) << where(step) << ": returned pool " << id;
      } else {
        // Its memory holds what its blocks occupied (a block belongs to its pool for life), and
        // lies in their pages.
        ASSERT_GE(st.cached_bytes + st.live_bytes, mp.ranges.bytes())
            << where(step) << ": pool " << id << " (use count " << mp.use << ")";
        ASSERT_LE(st.cached_bytes + st.live_bytes, mp.hull.bytes())
            << where(step) << ": pool " << id << " (use count " << mp.use << ")";
        size_t range_pages = 0;
        uint64_t last = UINT64_MAX;
        for (const auto& [a, b] : mp.hull.ranges()) {
          for (uint64_t pg = a / P; pg <= (b - 1) / P; ++pg) {
            range_pages += pg != last;
            last = pg;
          }
        }
        ASSERT_LE(st.physical_bytes, range_pages * P) << where(step) << ": pool " << id;
      }
      ++it;
    }

    // ---- the device's books ----
    ASSERT_EQ(alloc_->check_invariants(), "") << where(step);
    const core::DeviceStats st = alloc_->stats();
    ASSERT_EQ(st.requested_bytes, model.requested()) << where(step);
    ASSERT_EQ(st.allocated_bytes, model.allocated()) << where(step);
    ASSERT_EQ(st.live_blocks, model.live().size()) << where(step);
    ASSERT_EQ(st.num_ooms, model.ooms()) << where(step);
    ASSERT_EQ(st.touched_bytes, model.touched() * P) << where(step);
    ASSERT_LE(st.physical_bytes, capacity);
    if (step % 64 == 0) {
      ASSERT_EQ(books_vs_driver(), "") << where(step);
    }

    // ---- no data loss; a pool's pages stay where they are until it is returned ----
    const size_t spots = step % 64 == 0 ? kPatternSpots : 3;
    for (const auto& [a, b] : model.live()) {
      ASSERT_EQ(check_pattern(reinterpret_cast<void*>(a), b.requested, b.seed, spots), SIZE_MAX)
          << where(step) << ": live block " << reinterpret_cast<void*>(a) << " of " << b.requested
          << " bytes (pool " << owner.at(a).pool << ") lost its data";
    }
    if (step % 16 == 0) {
      for (const auto& [id, mp] : pools) {
        for (const auto& [pg, h] : mp.pages) {
          ASSERT_EQ(handle_at(pg * P), h)
              << where(step) << ": page at " << reinterpret_cast<void*>(pg * P) << " of pool " << id
              << " (use count " << mp.use << ", not returned) was remapped or unmapped";
        }
      }
    }
  }

  // Everything back: blocks freed, pools released, cache given back.
  sim::release_stream(s1);
  for (const auto& [a, b] : model.live()) {
    ASSERT_EQ(check_pattern(reinterpret_cast<void*>(a), b.requested, b.seed), SIZE_MAX);
    alloc_->deallocate(reinterpret_cast<void*>(a), b.stream);
  }
  for (auto& [id, mp] : pools) {
    while (mp.use > 0) {
      alloc_->release_pool(id);
      --mp.use;
    }
  }
  alloc_->release_cached();
  for (const auto& [id, mp] : pools) {
    EXPECT_FALSE(alloc_->has_pool(id)) << "pool " << id << " outlived its blocks and its return";
  }
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");

  std::printf(
      "seed %llu, %zu steps: %zu pools created, %zu returned, %zu forgotten; %zu allocs (%zu in "
      "pools, %zu reusing a pool's own memory), %zu OOMs (%zu into pools, %zu within 2 pages of "
      "the bound), %zu frees (%zu joined a pool), %zu trims, %zu release_cached\n",
      static_cast<unsigned long long>(seed), ops, n_create, n_returned, n_forgotten, n_alloc,
      n_pool_alloc, n_reuse_in_pool, n_oom, n_pool_oom, n_near_bound_oom, n_free, n_join, n_trim,
      n_release_cached);
  EXPECT_GT(n_oom, 0u) << "the workload never reached capacity; it tests too little";
  EXPECT_GT(n_pool_alloc, 0u);
  EXPECT_GT(n_returned, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, PoolPropertyTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<uint64_t>& p) {
                           return "seed" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace expanse::test
