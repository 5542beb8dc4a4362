// Stream-ordered reuse (docs/design.md, invariant 3) under an oracle.
//
// Before every free, the test records its own event on every stream that may still use the block
// (the freeing stream, the allocating stream, record_stream users). Until those events complete
// (a held stream's work completes on release or when someone synchronizes on it):
//   - an allocation on stream T may overlap the block only if every such event on a stream other
//     than T is complete;
//   - every page under the block stays mapped with the same handle.
// Random operations over a small device, with limits, release_cached, release_threshold, LIFO
// depths and held streams; the reference model checks invariant 1 both ways. Some configurations
// put thread caches in front (core/thread_cache.hpp): half the sizes then come from a small set,
// so that freed blocks are handed back from the cache, under the same oracle.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"
#include "reference_model.hpp"
#include "support/freed_memory_oracle.hpp"

#include <map>
#include <random>
#include <sstream>

namespace expanse::test {
namespace {

struct OracleParams {
  size_t capacity;
  size_t lifo_depth;
  size_t release_threshold;
  bool reclaim_first;
  uint64_t seed;
  size_t va_budget = 0;
  bool thread_cache = false;
};

class StreamOrderOracleTest : public CoreTest,
                              public ::testing::WithParamInterface<OracleParams> {};

TEST_P(StreamOrderOracleTest, StreamOrderedReuseAndUnmapNeverBeatPendingWork) {
  const OracleParams prm = GetParam();
  core::AllocatorOptions opts;
  opts.lifo_depth = prm.lifo_depth;
  opts.release_threshold = prm.release_threshold;
  opts.reclaim_before_create = prm.reclaim_first;
  opts.va_budget = prm.va_budget;
  if (prm.thread_cache) {
    opts.thread_cache_bytes = prm.capacity / 8;
    opts.thread_cache_entries = 32;
  }
  make(sim_config(prm.capacity), opts);
  const size_t P = alloc_->page_size();
  ReferenceModel model(P, prm.capacity);
  std::vector<CUstream> streams = {nullptr, new_stream(), new_stream(), new_stream()};
  std::mt19937_64 rng(prm.seed);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  const auto& t = drv_->table();
  PrimaryCtx ctx(t);

  using Oracle = FreedMemoryOracle<StreamUse<CUstream>>;
  Oracle oracle(t);
  std::vector<CUevent> spare;
  std::map<uintptr_t, std::vector<CUstream>> users;  // live block -> streams that used it
  auto new_event = [&]() {
    if (!spare.empty()) {
      CUevent e = spare.back();
      spare.pop_back();
      return e;
    }
    CUevent e = nullptr;
    EXPECT_EQ(t.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    return e;
  };
  auto to_spare = [&](const StreamUse<CUstream>& u) { spare.push_back(u.event); };

  const size_t ops = 20000;
  size_t repeat_n = 0;  // with caches: the size and stream the next step allocates (0: none)
  CUstream repeat_s = nullptr;
  size_t n_alloc = 0, n_oom = 0, n_same_stream_reuse = 0, n_pending_pages = 0;
  for (size_t step = 0; step < ops; ++step) {
    // Forget freed blocks whose work is all complete.
    oracle.forget_done(to_spare);
    // With caches: the step after a free, often an allocation of the same size on the freeing
    // stream (what a cache serves).
    const size_t dice = repeat_n != 0 ? 0 : pick(1000);
    if (dice < 450 || model.live().empty()) {
      size_t n;
      if (repeat_n != 0) {
        n = repeat_n;
      } else if (pick(20) == 0) {
        n = P + rng() % (prm.capacity / 2);
      } else if (prm.thread_cache && pick(2) == 0) {
        static constexpr size_t kRepeated[] = {512, 3000, 65536, 1 << 20, 3 << 20};
        n = kRepeated[pick(std::size(kRepeated))];
      } else {
        n = log_uniform_size(rng, 23);
      }
      CUstream s = repeat_n != 0 ? repeat_s : streams[pick(streams.size())];
      repeat_n = 0;
      const size_t avail = model.avail();
      void* p = nullptr;
      try {
        p = alloc_->allocate(n, s);
      } catch (const out_of_memory& e) {
        ASSERT_GT(model.pages_for(n), avail) << "step " << step << ": " << e.what();
        model.oom();
        ++n_oom;
      }
      if (p != nullptr) {
        auto a = reinterpret_cast<uintptr_t>(p);
        size_t sz = (n + 511) / 512 * 512;
        ASSERT_EQ(model.placement_error(a, sz, avail), "") << "step " << step << ": " << p;
        std::ostringstream pending;
        n_same_stream_reuse += oracle.check_allocation(
            a, sz, s, [&](const Oracle::Freed& f, const StreamUse<CUstream>& u) {
              if (pending.tellp() != 0) return;
              pending << "step " << step << ": block " << p << " handed to stream " << s
                      << " overlaps memory freed at " << reinterpret_cast<void*>(f.addr)
                      << " whose work on stream " << u.stream << " is still pending";
            });
        ASSERT_EQ(pending.str(), "");
        fill_pattern(p, n, step);
        model.add(a, ModelBlock{n, sz, s, step});
        users[a] = {s};
        ++n_alloc;
      }
    } else if (dice < 800) {
      auto it = model.live().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(model.live().size())));
      const uintptr_t a = it->first;
      const size_t sz = it->second.size;
      CUstream s = pick(4) == 0 ? streams[pick(streams.size())] : it->second.stream;
      Oracle::Freed f{a, sz, s, {}, {}};
      std::vector<CUstream> us = users[a];
      if (std::find(us.begin(), us.end(), s) == us.end()) us.push_back(s);
      for (CUstream u : us) {
        CUevent e = new_event();
        ASSERT_EQ(t.event_record(e, u), CUDA_SUCCESS);
        f.uses.push_back({u, e});
      }
      for (uintptr_t pg = a / P * P; pg < a + sz; pg += P) f.pages[pg] = handle_at(pg);
      alloc_->deallocate(reinterpret_cast<void*>(a), s);
      if (prm.thread_cache && pick(2) == 0) {
        repeat_n = it->second.requested;
        repeat_s = s;
      }
      model.remove(a);
      users.erase(a);
      oracle.freed(std::move(f));
    } else if (dice < 860) {
      auto it = model.live().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(model.live().size())));
      CUstream u = streams[pick(streams.size())];
      alloc_->record_stream(reinterpret_cast<void*>(it->first), u);
      auto& v = users[it->first];
      if (std::find(v.begin(), v.end(), u) == v.end()) v.push_back(u);
    } else if (dice < 920) {
      sim::hold_stream(streams[pick(streams.size())]);
    } else if (dice < 975) {
      sim::release_stream(streams[pick(streams.size())]);
    } else if (dice < 985) {
      alloc_->release_cached();
    } else {
      size_t lim = pick(2) == 0 ? SIZE_MAX : (prm.capacity / 4) + pick(prm.capacity / P) * P;
      alloc_->set_limit(lim);
      model.set_limit(lim);
    }

    // Pages under memory whose work is pending stay mapped, with the same handle (memory whose
    // work the allocator waited for during this step is exempt).
    std::ostringstream unmapped;
    oracle.for_each_pending([&](const Oracle::Freed& f) {
      n_pending_pages += f.pages.size();
      for (const auto& [pg, h] : f.pages) {
        if (unmapped.tellp() != 0 || handle_at(pg) == h) continue;
        unmapped << "step " << step << ": page " << reinterpret_cast<void*>(pg)
                 << " under memory freed at " << reinterpret_cast<void*>(f.addr)
                 << " was unmapped while work on it was pending";
      }
    });
    ASSERT_EQ(unmapped.str(), "");
    // (stats() gives parked blocks back: with caches, only now and then, so that they serve.)
    if (!prm.thread_cache || step % 64 == 0) {
      core::DeviceStats st = alloc_->stats();
      ASSERT_EQ(st.allocated_bytes, model.allocated());
      ASSERT_EQ(st.touched_bytes, model.touched() * P) << "step " << step;
    }
    if (step % 64 == 0) {
      ASSERT_EQ(books_vs_driver(), "") << "step " << step;
    }
    for (const auto& [a, b] : model.live()) {
      ASSERT_EQ(check_pattern(reinterpret_cast<void*>(a), b.requested, b.seed, 3), SIZE_MAX)
          << "step " << step;
    }
  }
  for (const auto& [a, b] : model.live()) alloc_->deallocate(reinterpret_cast<void*>(a), b.stream);
  for (CUstream s : streams) sim::release_stream(s);
  oracle.clear(to_spare);
  for (CUevent e : spare) t.event_destroy(e);
  EXPECT_GT(n_oom, 0u);
  EXPECT_GT(n_alloc, ops / 5);
  EXPECT_GT(n_same_stream_reuse, 0u) << "the oracle never saw memory reused under pending work";
  EXPECT_GT(n_pending_pages, 0u);
  const uint64_t hits = alloc_->stats().thread_cache_hits;
  if (prm.thread_cache) {
    EXPECT_GT(hits, n_alloc / 20) << "thread caches served too few allocations to be tested here";
  }
  std::printf("allocs %zu (%llu from thread caches), ooms %zu, reuses of memory with work pending "
              "%zu, pending page checks %zu\n",
              n_alloc, static_cast<unsigned long long>(hits), n_oom, n_same_stream_reuse,
              n_pending_pages);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, StreamOrderOracleTest,
    ::testing::Values(OracleParams{256 * MiB, 16, core::kNoLimit, false, 1},
                      OracleParams{256 * MiB, 0, core::kNoLimit, false, 2},
                      OracleParams{256 * MiB, 4, 16 * MiB, false, 3},
                      OracleParams{256 * MiB, 2, core::kNoLimit, true, 4},
                      OracleParams{64 * MiB, 1, 8 * MiB, true, 5},
                      OracleParams{1 * GiB, 16, core::kNoLimit, false, 6},
                      OracleParams{256 * MiB, 16, core::kNoLimit, false, 7, 2 * GiB},
                      OracleParams{256 * MiB, 4, core::kNoLimit, true, 8, 1536 * MiB},
                      OracleParams{256 * MiB, 16, core::kNoLimit, false, 9, 0, true},
                      OracleParams{256 * MiB, 2, 16 * MiB, true, 10, 0, true}),
    [](const ::testing::TestParamInfo<OracleParams>& p) {
      return "seed" + std::to_string(p.param.seed);
    });

}  // namespace
}  // namespace expanse::test
