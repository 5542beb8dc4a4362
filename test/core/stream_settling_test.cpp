// Several streams settle on a repeated workload (docs/design.md, "Settling on a repeated
// workload"): a stream whose freed memory another stream wants records a fence at its own free,
// and the other stream's allocation asks that fence (a query, no record, no wait) before giving
// up on the place its twin had. Invariant 3 stays exact: a fence not complete keeps the memory
// from the other stream.
#include "core_fixture.hpp"
#include "core/wanted_ranges.hpp"

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
