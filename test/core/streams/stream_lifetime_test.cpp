// Streams that end (destroyed after a free or a record_stream) and blocks used by several
// streams: freed memory waits for every stream that used it, and nothing breaks when a stream
// is gone.
#include "core_fixture.hpp"

#include <algorithm>

namespace expanse::test {
namespace {

bool overlaps(uintptr_t x, size_t xn, uintptr_t y, size_t yn) { return x < y + yn && y < x + xn; }

class StreamLifetimeTest : public CoreTest {};

// Memory freed on a stream gets its fence lazily, when the allocator polls. The application may
// destroy the stream after the free (cudaFreeAsync then cudaStreamDestroy): later allocations that
// poll and release_cached() must go on working (the stream's context is synchronized instead).
TEST_F(StreamLifetimeTest, DestroyingAStreamAfterFreeingOnItDoesNotBreakTheAllocator) {
  core::AllocatorOptions o;
  o.lifo_depth = 0;  // the freed block goes straight to the index, owned by s1
  make(sim_config(1 * GiB), o);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(64 * MiB, s1);
  alloc_->deallocate(a, s1);
  ASSERT_EQ(drv_->table().stream_destroy(s1), CUDA_SUCCESS);
  streams_.erase(std::find(streams_.begin(), streams_.end(), s1));
  for (int i = 0; i < 3; ++i) {
    void* b = nullptr;
    EXPECT_NO_THROW(b = alloc_->allocate(128 * MiB, s2)) << "attempt " << i;
    alloc_->deallocate(b, s2);
  }
  EXPECT_NO_THROW(alloc_->release_cached());
}

// A block used (record_stream) on a stream destroyed before the free can still be freed.
TEST_F(StreamLifetimeTest, FreeAfterTheRecordedStreamWasDestroyedSucceeds) {
  make(sim_config(1 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(4 * MiB, s1);
  alloc_->record_stream(a, s2);
  ASSERT_EQ(drv_->table().stream_destroy(s2), CUDA_SUCCESS);
  streams_.erase(std::find(streams_.begin(), streams_.end(), s2));
  EXPECT_NO_THROW(alloc_->deallocate(a, s1));
}

// record_stream + free on a third stream: the memory waits for all three.
TEST_F(StreamLifetimeTest, RecordStreamAndFreeOnAThirdStreamWaitsForAll) {
  make(sim_config(1 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream(), s3 = new_stream();
  void* a = alloc_->allocate(8 * MiB, s1);
  alloc_->record_stream(a, s2);
  sim::hold_stream(s2);
  alloc_->deallocate(a, s3);
  for (CUstream s : {s1, s3}) {
    void* b = alloc_->allocate(8 * MiB, s);
    EXPECT_FALSE(overlaps(reinterpret_cast<uintptr_t>(a), 8 * MiB, reinterpret_cast<uintptr_t>(b),
                          8 * MiB));
    alloc_->deallocate(b, s);
  }
  sim::release_stream(s2);
}

// Safe memory merged into a block owned by a held stream becomes owned by it (conservative), and
// a later wait-for-all (release_cached) still makes everything safe and trims to live pages.
TEST_F(StreamLifetimeTest, SafeMemoryMergedIntoAnOwnedBlockIsReleasedAfterWaiting) {
  core::AllocatorOptions o;
  o.lifo_depth = 0;
  make(sim_config(1 * GiB), o);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(64 * MiB, s1);
  void* b = alloc_->allocate(64 * MiB, s2);
  void* c = alloc_->allocate(64 * MiB, s1);
  sim::hold_stream(s1);
  sim::hold_stream(s2);
  alloc_->deallocate(b, s2);
  alloc_->deallocate(a, s1);
  alloc_->deallocate(c, s1);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");
  sim::release_stream(s1);
  sim::release_stream(s2);
}

}  // namespace
}  // namespace expanse::test
