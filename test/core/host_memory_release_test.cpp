// Out of host memory while memory goes back: release_cached (its trim unmaps and releases pages),
// the poll that settles stream-ordered frees, and a pool's return and forgetting. Each call either
// fails whole (std::bad_alloc, which the C API reports as EXPANSE_ENOMEM) or completes; nothing
// allocated before is lost, and the books agree with the driver either way. Each test fails the
// n-th host allocation of the call, persistently or once, for every n until the call makes no
// more; after each it checks the live blocks' bytes, the books against the sim, and that the same
// call with memory back leaves what a call that never failed leaves.
#include "host_memory_fixture.hpp"

#include <new>
#include <string>

namespace expanse::test {
namespace {

// What a call leaves that a later one sees.
struct Books {
  uint64_t mapped = 0, physical = 0, va = 0, live = 0, allocated = 0;
  bool operator==(const Books& o) const {
    return mapped == o.mapped && physical == o.physical && va == o.va && live == o.live &&
           allocated == o.allocated;
  }
};

std::ostream& operator<<(std::ostream& os, const Books& b) {
  return os << "{mapped " << b.mapped << ", physical " << b.physical << ", va " << b.va
            << ", live " << b.live << ", allocated " << b.allocated << "}";
}

class HostMemoryReleaseTest : public HostMemoryFailureTest {
 protected:
  struct Kept {
    void* p;
    size_t bytes;
    uint64_t seed;
  };

  Books books() const {
    const core::DeviceStats st = alloc_->stats();
    return {st.mapped_bytes, st.physical_bytes, st.va_reserved_bytes, st.live_blocks,
            st.allocated_bytes};
  }

  // Every kept block still holds its bytes, and the books agree with the driver.
  void expect_intact(const std::vector<Kept>& kept, size_t n) {
    for (const Kept& k : kept) {
      EXPECT_EQ(check_pattern(k.p, k.bytes, k.seed), SIZE_MAX)
          << "a live block lost its bytes; failing from allocation " << n;
    }
    EXPECT_EQ(books_vs_driver(), "") << "failing from allocation " << n;
  }

  void free_all(std::vector<Kept>& kept, CUstream s) {
    for (const Kept& k : kept) alloc_->deallocate(k.p, s);
    kept.clear();
    alloc_->release_cached();
    EXPECT_EQ(books_vs_driver(), "");
    EXPECT_EQ(sim::outstanding().physical_bytes, 0u);
  }

  // Sweeps n: setup() builds the state and returns the blocks to keep, op is the call under
  // test. The call retried with memory back must leave what one run without failures leaves;
  // after() checks more of that (threw: whether the failing call threw).
  template <class Setup, class Op, class After>
  void sweep(Setup&& setup, Op&& op, After&& after) {
    Books want;
    {
      make(sim_config(1 * GiB));
      CUstream s = new_stream();
      std::vector<Kept> kept = setup(s);
      op(s);
      want = books();
      free_all(kept, s);
    }
    size_t n = 1;
    for (bool failed = true; failed; ++n) {
      make(sim_config(1 * GiB));
      CUstream s = new_stream();
      std::vector<Kept> kept = setup(s);
      const Run r = failing_from(n, [&] { op(s); });
      failed = r.failed;
      const bool threw = r.threw;
      expect_intact(kept, n);
      op(s);  // memory back
      EXPECT_EQ(books(), want) << "failing from allocation " << n;
      expect_intact(kept, n);
      after(threw, n);
      free_all(kept, s);
      if (HasFailure()) return;
    }
    EXPECT_GT(n, 3u) << "the call made host allocations to fail";
  }

  // Blocks of many sizes, every other one freed: free memory mapped between live blocks, each
  // freed block a free-index entry of its own, for the trim to unmap and release.
  std::vector<Kept> fragmented(CUstream s) {
    std::vector<Kept> kept;
    std::vector<void*> freed;
    const size_t sizes[] = {64 * KiB, 3 * MiB, 512 * KiB, 6 * MiB, 2 * MiB, 1 * MiB};
    for (int i = 0; i < 24; ++i) {
      const size_t bytes = sizes[i % 6] + (i / 6) * 4 * KiB;
      void* p = alloc_->allocate(bytes, s);
      if (i % 2 == 0) {
        freed.push_back(p);
        continue;
      }
      fill_pattern(p, bytes, static_cast<uint64_t>(i));
      kept.push_back({p, bytes, static_cast<uint64_t>(i)});
    }
    for (void* p : freed) alloc_->deallocate(p, s);
    return kept;
  }
};

// The trim unmaps whole handles into the handle pool and releases them: a handle the driver
// unmapped is in the pool, or still mapped in the books, never neither.
TEST_P(HostMemoryReleaseTest, ReleaseCachedFailsWholeOrCompletes) {
  sweep([&](CUstream s) { return fragmented(s); }, [&](CUstream) { alloc_->release_cached(); },
        [&](bool, size_t) {});
}

// Blocks another stream used (record_stream) wait, pending, for its work; the poll puts each
// back in the free index once proven, each with an index entry of its own (live blocks between
// them): a block is pending or free, never neither.
TEST_P(HostMemoryReleaseTest, PollSettlesEachPendingBlockOrLeavesItPending) {
  CUstream other = nullptr;
  sweep(
      [&](CUstream s) {
        other = new_stream();
        std::vector<Kept> kept;
        for (int i = 0; i < 16; ++i) {
          const size_t bytes = (i % 2 == 0 ? 256 * KiB : 96 * KiB) + i * 4 * KiB;
          void* p = alloc_->allocate(bytes, s);
          if (i % 2 == 0) {
            alloc_->record_stream(p, other);
            alloc_->deallocate(p, s);  // pending until other's work is proven done
            continue;
          }
          fill_pattern(p, bytes, static_cast<uint64_t>(i));
          kept.push_back({p, bytes, static_cast<uint64_t>(i)});
        }
        return kept;
      },
      [&](CUstream) { alloc_->release_cached(); }, [&](bool, size_t) {});
}

// A pool released with nothing in it is forgotten at once: on a throw it is still there, in use,
// and releasing it again forgets it.
TEST_P(HostMemoryReleaseTest, ReleasingAnEmptyPoolForgetsItOrChangesNothing) {
  size_t n = 1;
  for (bool failed = true; failed; ++n) {
    make(sim_config(1 * GiB));
    constexpr core::PoolId kPool = 7;
    alloc_->create_pool(kPool);
    const Run r = failing_from(n, [&] { alloc_->release_pool(kPool); });
    failed = r.failed;
    const bool threw = r.threw;
    EXPECT_EQ(alloc_->has_pool(kPool), threw) << "failing from allocation " << n;
    if (threw) {
      EXPECT_NO_THROW(alloc_->release_pool(kPool))
          << "a release that threw left the pool released; failing from allocation " << n;
    }
    EXPECT_FALSE(alloc_->has_pool(kPool)) << "failing from allocation " << n;
    EXPECT_EQ(alloc_->check_invariants(), "") << "failing from allocation " << n;
    if (HasFailure()) return;
  }
  EXPECT_GT(n, 1u);
}

// A released pool with free memory and no live block is returned and forgotten by
// release_cached; a returned pool whose last live block is freed is forgotten by that free. Out
// of host memory neither keeps the pool's slot for good.
TEST_P(HostMemoryReleaseTest, AReturnedPoolIsForgottenByReleaseCached) {
  constexpr core::PoolId kPool = 7;
  sweep(
      [&](CUstream s) {
        alloc_->create_pool(kPool);
        std::vector<Kept> kept;
        void* p = alloc_->allocate(3 * MiB, s, kPool);
        void* q = alloc_->allocate(1 * MiB, s, kPool);
        void* d = alloc_->allocate(2 * MiB, s);
        fill_pattern(d, 2 * MiB, 1);
        kept.push_back({d, 2 * MiB, 1});
        alloc_->deallocate(p, s);
        alloc_->deallocate(q, s);
        alloc_->release_pool(kPool);  // free memory in it: waits for a proof
        EXPECT_TRUE(alloc_->has_pool(kPool));
        return kept;
      },
      [&](CUstream) { alloc_->release_cached(); },
      [&](bool threw, size_t n) {
        EXPECT_FALSE(alloc_->has_pool(kPool))
            << (threw ? "threw, then retried" : "completed") << "; failing from allocation " << n;
      });
}

TEST_P(HostMemoryReleaseTest, TheFreeOfAReturnedPoolsLastBlockForgetsIt) {
  size_t n = 1;
  for (bool failed = true; failed; ++n) {
    make(sim_config(1 * GiB));
    constexpr core::PoolId kPool = 7;
    CUstream s = new_stream();
    alloc_->create_pool(kPool);
    void* p = alloc_->allocate(3 * MiB, s, kPool);
    void* keep = alloc_->allocate(1 * MiB, s);
    fill_pattern(keep, 1 * MiB, 3);
    alloc_->release_pool(kPool);
    alloc_->release_cached();  // returned: its memory is the default pool's, p still live
    ASSERT_TRUE(alloc_->has_pool(kPool));
    const Run r = failing_from(n, [&] { alloc_->deallocate(p, s); });
    failed = r.failed;
    const bool threw = r.threw;
    if (threw) {
      EXPECT_TRUE(alloc_->owns(p)) << "a free that threw freed; failing from allocation " << n;
      EXPECT_NO_THROW(alloc_->deallocate(p, s)) << "failing from allocation " << n;
    }
    EXPECT_FALSE(alloc_->has_pool(kPool))
        << "the returned pool kept its slot; failing from allocation " << n;
    EXPECT_EQ(check_pattern(keep, 1 * MiB, 3), SIZE_MAX) << "failing from allocation " << n;
    EXPECT_EQ(books_vs_driver(), "") << "failing from allocation " << n;
    alloc_->deallocate(keep, s);
    alloc_->release_cached();
    EXPECT_EQ(books_vs_driver(), "") << "failing from allocation " << n;
    if (HasFailure()) return;
  }
  EXPECT_GT(n, 1u);
}

EXPANSE_INSTANTIATE_FAILING(HostMemoryReleaseTest);

}  // namespace
}  // namespace expanse::test
