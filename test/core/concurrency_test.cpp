// Any number of threads allocate and free concurrently (run under TSan in CI).
// EXPANSE_CONCURRENCY_OPS overrides the operations per thread (default 10^5).
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

namespace expanse::test {
namespace {

class ConcurrencyTest : public CoreTest {};

TEST_F(ConcurrencyTest, EightThreadsAllocateAndFreeWithoutLosingData) {
  make(sim_config(16 * GiB));
  const char* env = std::getenv("EXPANSE_CONCURRENCY_OPS");
  const size_t ops = env != nullptr ? std::strtoull(env, nullptr, 10) : 20000;  // 10^5 in the soak
  const int threads = 8;
  std::vector<CUstream> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(new_stream());
  std::atomic<size_t> corrupt{0}, failures{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<uint64_t>(id) * 7919);
    struct Live {
      void* p;
      size_t n;
      uint64_t seed;
    };
    std::vector<Live> live;
    CUstream mine = streams[static_cast<size_t>(id)];
    for (size_t i = 0; i < ops; ++i) {
      if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
        size_t n = 1 + rng() % (rng() % 16 == 0 ? 16 * MiB : 64 * KiB);
        try {
          void* p = alloc_->allocate(n, mine);
          uint64_t seed = (static_cast<uint64_t>(id) << 40) | i;
          fill_pattern(p, n, seed);
          live.push_back({p, n, seed});
        } catch (const out_of_memory&) {
          failures.fetch_add(1);
        }
      } else {
        size_t k = rng() % live.size();
        if (check_pattern(live[k].p, live[k].n, live[k].seed) != SIZE_MAX) corrupt.fetch_add(1);
        // Now and then another thread's stream uses it too.
        if (rng() % 32 == 0) {
          alloc_->record_stream(live[k].p, streams[rng() % streams.size()]);
        }
        alloc_->deallocate(live[k].p, mine);
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (const Live& b : live) {
      if (check_pattern(b.p, b.n, b.seed) != SIZE_MAX) corrupt.fetch_add(1);
      alloc_->deallocate(b.p, mine);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& th : pool) th.join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_EQ(failures.load(), 0u);
  core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.num_allocs, st.num_frees);
  EXPECT_EQ(alloc_->check_invariants(), "");
}

}  // namespace
}  // namespace expanse::test
