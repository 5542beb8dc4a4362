// Several streams settle on a repeated workload (docs/design.md, "Settling on a repeated
// workload"): a stream whose freed memory another stream wants records a fence at its own free,
// and the other stream's allocation asks that fence (a query, no record, no wait) before giving
// up on the place its twin had. Invariant 3 stays exact: a fence not complete keeps the memory
// from the other stream.
#include "core_fixture.hpp"
#include "core/streams/wanted_ranges.hpp"
#include "support/freed_memory_oracle.hpp"

#include <cstdio>
#include <map>
#include <random>
#include <sstream>

namespace expanse::test {
namespace {

using driver::EntryPoint;

constexpr EntryPoint kVmmCalls[] = {EntryPoint::mem_address_reserve, EntryPoint::mem_address_free,
                                    EntryPoint::mem_create, EntryPoint::mem_release,
                                    EntryPoint::mem_map, EntryPoint::mem_unmap,
                                    EntryPoint::mem_set_access};

uint64_t vmm_calls() {
  uint64_t n = 0;
  for (EntryPoint e : kVmmCalls) n += sim::call_count(e);
  return n;
}

bool overlaps(void* a, size_t an, void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

class StreamSettlingTest : public CoreTest {};

// A block allocated on one stream and freed on another (a prefetch, a buffer handed to a
// consumer stream), once a repetition. The allocating stream's next allocation at this point
// wants the block back, which is the freeing stream's until a fence there completes: without a
// fence recorded at the free, each repetition mapped a new 64 MiB.
TEST_F(StreamSettlingTest, BlockAllocatedOnOneStreamAndFreedOnAnotherIsReusedWithoutMapping) {
  make(sim_config(8 * GiB, false));
  CUstream producer = new_stream(), consumer = new_stream();
  std::vector<uint64_t> calls;
  void* first = nullptr;
  for (int rep = 0; rep < 6; ++rep) {
    const uint64_t before = vmm_calls();
    void* p = alloc_->allocate(64 * MiB, producer);
    if (rep == 0) first = p;
    alloc_->record_stream(p, consumer);
    alloc_->deallocate(p, consumer);
    calls.push_back(vmm_calls() - before);
  }
  for (size_t rep = 2; rep < calls.size(); ++rep) {
    EXPECT_EQ(calls[rep], 0u) << "repetition " << rep + 1;
  }
  EXPECT_EQ(sim::outstanding().physical_bytes, 64 * MiB) << "new memory for each repetition";
  (void)first;
}

// While the stream that freed a block stays behind (its work held), the allocation that wants
// the block back asks that stream's fence once, not once for every place the echo remembers:
// a fence not passed now has not passed a moment later.
TEST_F(StreamSettlingTest, AFenceThatFellShortIsAskedOncePerAllocation) {
  make(sim_config(8 * GiB, false));
  CUstream producer = new_stream(), consumer = new_stream();
  sim::hold_stream(consumer);
  constexpr int kPairs = 300;
  uint64_t queries = 0;
  for (int i = 0; i < kPairs; ++i) {
    const uint64_t before = sim::call_count(EntryPoint::event_query);
    void* p = alloc_->allocate(2 * MiB, producer);
    queries += sim::call_count(EntryPoint::event_query) - before;
    alloc_->record_stream(p, consumer);
    alloc_->deallocate(p, consumer);
  }
  sim::release_all();
  // Measured: 2.1 an allocation (the echo's one question, then the placement's poll), against
  // 4.0 when each place the echo remembers asked again.
  EXPECT_LE(queries, 5u * kPairs / 2) << queries << " fence queries for " << kPairs
                                      << " allocations";
}

// The same with the free on the stream that did not allocate and no record_stream, and a third
// stream that only allocates: two streams' proofs stand between the block and its next use.
TEST_F(StreamSettlingTest, CrossStreamFreesOfTwoStreamsSettle) {
  make(sim_config(8 * GiB, false));
  CUstream a = new_stream(), b = new_stream(), c = new_stream();
  std::vector<uint64_t> calls;
  for (int rep = 0; rep < 6; ++rep) {
    const uint64_t before = vmm_calls();
    void* x = alloc_->allocate(32 * MiB, a);
    void* y = alloc_->allocate(48 * MiB, b);
    void* z = alloc_->allocate(16 * MiB, c);
    alloc_->deallocate(x, b);
    alloc_->deallocate(y, a);
    alloc_->deallocate(z, c);
    calls.push_back(vmm_calls() - before);
  }
  for (size_t rep = 2; rep < calls.size(); ++rep) {
    EXPECT_EQ(calls[rep], 0u) << "repetition " << rep + 1;
  }
}

// Invariant 3 under the mechanism: the freeing stream's work is still running (held), so the
// fence recorded at its free is not complete; the allocating stream's next allocation at the
// same point must go elsewhere, and gets the place back once the work is done.
TEST_F(StreamSettlingTest, MemoryFreedOnAStreamIsNotHandedToAnotherBeforeItsFenceCompletes) {
  make(sim_config(8 * GiB, false));
  CUstream producer = new_stream(), consumer = new_stream();
  void* settled = nullptr;
  for (int rep = 0; rep < 8; ++rep) {  // settled: the same place every repetition
    void* p = alloc_->allocate(64 * MiB, producer);
    if (rep >= 2) {
      EXPECT_EQ(p, settled) << "repetition " << rep + 1;
    }
    settled = p;
    alloc_->deallocate(p, consumer);
  }
  const uint64_t queries = sim::call_count(EntryPoint::event_query);
  void* p = alloc_->allocate(64 * MiB, producer);
  ASSERT_EQ(p, settled);
  sim::hold_stream(consumer);  // the consumer's work up to the free is still running
  alloc_->deallocate(p, consumer);
  void* q = alloc_->allocate(64 * MiB, producer);  // its point wants `settled`
  EXPECT_FALSE(overlaps(q, 64 * MiB, settled, 64 * MiB))
      << "memory freed on the consumer handed to the producer before its fence completed";
  EXPECT_GT(sim::call_count(EntryPoint::event_query), queries) << "the fence was not asked";
  EXPECT_EQ(sim::call_count(EntryPoint::event_synchronize), 0u) << "the allocation waited";
  EXPECT_EQ(sim::call_count(EntryPoint::ctx_synchronize), 0u) << "the allocation waited";
  alloc_->deallocate(q, consumer);
  // The consumer's work done, the workload settles again (where q went, or back), mapping
  // nothing more.
  sim::release_stream(consumer);
  for (int rep = 0; rep < 2; ++rep) {
    void* r = alloc_->allocate(64 * MiB, producer);
    alloc_->deallocate(r, consumer);
  }
  const uint64_t before = vmm_calls();
  void* r = alloc_->allocate(64 * MiB, producer);
  alloc_->deallocate(r, consumer);
  EXPECT_EQ(vmm_calls(), before);
  EXPECT_EQ(sim::async_faults(), 0u);
}

// Invariant 3 under the oracle of stream_order_oracle_test.cpp, on a repeated workload (where
// the echo asks other streams' fences and frees record them): a random script of allocations,
// cross-stream frees and record_stream calls on four streams (the legacy one included) runs
// again and again while streams are held and released at random points. Before each free the
// test records its own event on every stream that may still use the block; an allocation on T
// may overlap such memory only when every event of a stream other than T is complete, and the
// pages under it stay mapped with the same handle.
TEST_F(StreamSettlingTest, RepeatedCrossStreamWorkloadNeverBeatsPendingWork) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    make(sim_config(512 * MiB, false));
    const auto& t = drv_->table();
    PrimaryCtx ctx(t);
    std::vector<CUstream> streams = {nullptr, new_stream(), new_stream(), new_stream()};
    std::mt19937_64 rng(seed);
    auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
    struct Op {
      int kind;  // 0 allocate, 1 free, 2 record_stream
      size_t slot, size, stream;
    };
    constexpr size_t kSlots = 10;
    static constexpr size_t kSizes[] = {512, 4096, 1 << 20, 3 << 20, 2 * MiB, 8 * MiB,
                                        20 * MiB + 512};
    std::vector<Op> script;
    std::vector<bool> live(kSlots, false);
    for (int i = 0; i < 60; ++i) {
      const size_t slot = pick(kSlots);
      if (!live[slot]) {
        script.push_back({0, slot, kSizes[pick(std::size(kSizes))], pick(4)});
        live[slot] = true;
      } else if (pick(3) == 0) {
        script.push_back({2, slot, 0, pick(4)});
      } else {
        script.push_back({1, slot, 0, pick(4)});
        live[slot] = false;
      }
    }
    for (size_t slot = 0; slot < kSlots; ++slot) {
      if (live[slot]) script.push_back({1, slot, 0, pick(4)});
    }
    using Oracle = FreedMemoryOracle<StreamUse<CUstream>>;
    Oracle oracle(t);
    auto destroy = [&](const StreamUse<CUstream>& u) { t.event_destroy(u.event); };
    std::vector<void*> ptr(kSlots, nullptr);
    std::vector<size_t> sz(kSlots, 0);
    std::vector<std::vector<CUstream>> users(kSlots);
    const size_t P = alloc_->page_size();
    size_t checked = 0;
    for (int rep = 0; rep < 150; ++rep) {
      for (size_t i = 0; i < script.size(); ++i) {
        const Op& op = script[i];
        if (pick(10) == 0) {
          if (pick(2) == 0) {
            sim::hold_stream(streams[pick(4)]);
          } else {
            sim::release_stream(streams[pick(4)]);
          }
        }
        CUstream s = streams[op.stream];
        if (op.kind == 0) {
          void* p = alloc_->allocate(op.size, s);
          const size_t n = (op.size + 511) / 512 * 512;
          std::ostringstream pending;
          checked += oracle.check_allocation(
              reinterpret_cast<uintptr_t>(p), n, s,
              [&](const Oracle::Freed& f, const StreamUse<CUstream>& u) {
                if (pending.tellp() != 0) return;
                pending << "seed " << seed << " rep " << rep << " op " << i << ": block " << p
                        << " handed to stream " << s << " overlaps memory freed at "
                        << reinterpret_cast<void*>(f.addr) << " whose work on stream "
                        << u.stream << " is still pending";
              });
          ASSERT_EQ(pending.str(), "");
          ptr[op.slot] = p;
          sz[op.slot] = n;
          users[op.slot] = {s};
        } else if (op.kind == 2) {
          alloc_->record_stream(ptr[op.slot], s);
          users[op.slot].push_back(s);
        } else {
          const auto a = reinterpret_cast<uintptr_t>(ptr[op.slot]);
          Oracle::Freed f{a, sz[op.slot], s, {}, {}};
          std::vector<CUstream> us = users[op.slot];
          us.push_back(s);
          for (CUstream u : us) {
            CUevent e = nullptr;
            ASSERT_EQ(t.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
            ASSERT_EQ(t.event_record(e, u), CUDA_SUCCESS);
            f.uses.push_back({u, e});
          }
          for (uintptr_t pg = a / P * P; pg < a + f.size; pg += P) f.pages[pg] = handle_at(pg);
          alloc_->deallocate(ptr[op.slot], s);
          oracle.freed(std::move(f));
        }
        oracle.forget_done(destroy);
        std::ostringstream unmapped;
        oracle.for_each_pending([&](const Oracle::Freed& f) {
          for (const auto& [pg, h] : f.pages) {
            if (unmapped.tellp() != 0 || handle_at(pg) == h) continue;
            unmapped << "seed " << seed << " rep " << rep << " op " << i << ": page "
                     << reinterpret_cast<void*>(pg) << " unmapped while work on it was pending";
          }
        });
        ASSERT_EQ(unmapped.str(), "");
      }
    }
    for (CUstream s : streams) sim::release_stream(s);
    oracle.clear(destroy);
    EXPECT_GT(checked, 0u) << "seed " << seed << ": no reuse under pending work was checked";
    std::printf("seed %llu: reuses of memory with work pending %zu\n",
                static_cast<unsigned long long>(seed), checked);
    EXPECT_EQ(sim::async_faults(), 0u);
    EXPECT_EQ(alloc_->check_invariants(), "");
    alloc_.reset();
    for (CUstream st : streams_) t.stream_destroy(st);
    streams_.clear();
  }
}

TEST(WantedRangesTest, MergesRangesAndMeetsWhatOverlapsOrTouches) {
  core::WantedRanges w;
  w.want(100, 200, 1);
  w.want(300, 400, 1);
  EXPECT_EQ(w.size(), 2u);
  EXPECT_TRUE(w.meets(150, 160, 2));
  EXPECT_TRUE(w.meets(50, 100, 2));    // touches the start
  EXPECT_TRUE(w.meets(200, 250, 2));   // touches the end
  EXPECT_FALSE(w.meets(201, 299, 2));  // between
  EXPECT_FALSE(w.meets(401, 500, 2));
  w.want(200, 300, 3);  // bridges both
  EXPECT_EQ(w.size(), 1u);
  EXPECT_TRUE(w.meets(250, 260, 4));
}

TEST(WantedRangesTest, ForgetsWhatNobodyWantedForLong) {
  core::WantedRanges w;
  w.want(100, 200, 1);
  EXPECT_TRUE(w.meets(100, 200, 1 + core::WantedRanges::kKeepCalls));
  EXPECT_FALSE(w.meets(100, 200, 2 + core::WantedRanges::kKeepCalls));
  EXPECT_TRUE(w.empty());
}

TEST(WantedRangesTest, StartsOverWhenFull) {
  core::WantedRanges w;
  for (size_t i = 0; i < core::WantedRanges::kMaxRanges; ++i) w.want(i * 10, i * 10 + 5, 1);
  EXPECT_EQ(w.size(), core::WantedRanges::kMaxRanges);
  w.want(1u << 30, (1u << 30) + 5, 1);
  EXPECT_EQ(w.size(), 1u);
}

}  // namespace
}  // namespace expanse::test
