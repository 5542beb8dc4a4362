// The locked path in steady state takes nothing from the heap (nor does the thread caches' front): an allocate+free pair of a warm
// block splits a free block and merges it back, and every index node that takes or gives back
// is kept for the next one. A heap allocation per pair would cost the pair a malloc and a free
// for each node (about a fifth of its time on the sim) and, under host memory pressure, give
// the free path one more way to run out.
#include "core_fixture.hpp"
#include "support/host_alloc_failure.hpp"

#include <vector>

namespace expanse::test {
namespace {

struct Shape {
  size_t bytes;
  bool neighbour_live;  // a live block right before the pair's (its split has a rest only after)
  bool two_streams;     // alternate the pair between two streams
  bool thread_cache;    // the lock-free front in front of the books
  const char* name;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

class QuietHeapTest : public CoreTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(QuietHeapTest, AWarmPairMakesNoHostAllocation) {
#ifdef EXPANSE_CHECKED
  GTEST_SKIP() << "the checked build's end-of-call check builds books of its own on the heap";
#endif
  const Shape& shape = GetParam();
  core::AllocatorOptions opts;
  if (shape.thread_cache) {
    opts.thread_cache_bytes = 256 * MiB;
    opts.thread_cache_entries = 64;
  }
  make(sim_config(1 * GiB), opts);
  CUstream s[2] = {new_stream(), new_stream()};
  void* before = shape.neighbour_live ? alloc_->allocate(shape.bytes, s[0]) : nullptr;
  auto pair = [&](int i) {
    CUstream st = s[shape.two_streams ? i % 2 : 0];
    void* p = alloc_->allocate(shape.bytes, st);
    alloc_->deallocate(p, st);
  };
  for (int i = 0; i < 8; ++i) pair(i);  // warm: pages mapped, placements remembered
  constexpr int kPairs = 200;
  const uint64_t hits = alloc_->stats().thread_cache_hits;
  HostAllocFailure count(SIZE_MAX);  // fails nothing: counts this thread's operator new calls
  for (int i = 0; i < kPairs; ++i) pair(i);
  const size_t calls = count.stop();
  EXPECT_EQ(calls, 0u) << kPairs << " warm pairs of " << shape.bytes
                       << " bytes allocated from the heap " << calls << " times";
  if (shape.thread_cache) {
    EXPECT_EQ(alloc_->stats().thread_cache_hits - hits, uint64_t{kPairs}) << "served by the front";
  }
  if (before != nullptr) alloc_->deallocate(before, s[0]);
  EXPECT_EQ(alloc_->check_invariants(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuietHeapTest,
    ::testing::Values(Shape{512, false, false, false, "small"},
                      Shape{4096, true, false, false, "page_tail"},
                      Shape{1 * MiB, false, false, false, "one_mib"},
                      Shape{3 * MiB, true, false, false, "two_pages_next_to_a_live_block"},
                      Shape{64 * MiB, false, false, false, "many_pages"},
                      Shape{4096, false, true, false, "two_streams"},
                      Shape{4096, false, false, true, "thread_cache"},
                      Shape{1 * MiB, true, true, true, "thread_cache_two_streams"}),
    [](const ::testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace expanse::test
