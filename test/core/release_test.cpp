// Giving memory back: release_cached, limit, release_threshold.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

namespace expanse::test {
namespace {

class ReleaseTest : public CoreTest {};

TEST_F(ReleaseTest, ReleaseCachedLeavesOnlyLivePages) {
  make(sim_config(4 * GiB));
  std::vector<void*> v;
  for (int i = 0; i < 20; ++i) v.push_back(alloc_->allocate(100 * MiB, nullptr));
  for (int i = 0; i < 20; i += 2) alloc_->deallocate(v[static_cast<size_t>(i)], nullptr);
  alloc_->release_cached();
  core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.mapped_bytes, st.touched_bytes);
  EXPECT_EQ(st.pooled_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(sim::outstanding().physical_bytes, st.touched_bytes);
  for (int i = 1; i < 20; i += 2) alloc_->deallocate(v[static_cast<size_t>(i)], nullptr);
  alloc_->release_cached();
  EXPECT_EQ(sim::outstanding().physical_bytes, 0u);
  EXPECT_EQ(alloc_->stats().va_reserved_bytes, 0u) << "empty reservations are returned too";
}

TEST_F(ReleaseTest, LimitCapsPhysicalMemoryAndCanBeLifted) {
  make(sim_config(4 * GiB));
  alloc_->set_limit(1 * GiB);
  void* a = alloc_->allocate(700 * MiB, nullptr);
  EXPECT_THROW(alloc_->allocate(400 * MiB, nullptr), out_of_memory);
  EXPECT_LE(alloc_->stats().physical_bytes, 1 * GiB);
  alloc_->deallocate(a, nullptr);
  void* b = alloc_->allocate(1 * GiB, nullptr);  // the freed pages are reused under the cap
  EXPECT_LE(alloc_->stats().physical_bytes, 1 * GiB);
  alloc_->set_limit(core::kNoLimit);
  void* c = alloc_->allocate(2 * GiB, nullptr);
  alloc_->deallocate(b, nullptr);
  alloc_->deallocate(c, nullptr);
}

TEST_F(ReleaseTest, LoweringTheLimitTrimsCachedMemory) {
  make(sim_config(4 * GiB));
  void* a = alloc_->allocate(2 * GiB, nullptr);
  void* b = alloc_->allocate(256 * MiB, nullptr);
  alloc_->deallocate(a, nullptr);
  alloc_->set_limit(512 * MiB);
  core::DeviceStats st = alloc_->stats();
  EXPECT_LE(st.physical_bytes, 512 * MiB);
  EXPECT_EQ(sim::outstanding().physical_bytes, st.physical_bytes);
  alloc_->deallocate(b, nullptr);
}

TEST_F(ReleaseTest, ReleaseThresholdBoundsCachedMemory) {
  core::AllocatorOptions o;
  o.release_threshold = 256 * MiB;
  o.lifo_depth = 0;
  make(sim_config(4 * GiB), o);
  std::vector<void*> v;
  for (int i = 0; i < 8; ++i) v.push_back(alloc_->allocate(256 * MiB, nullptr));
  for (void* p : v) alloc_->deallocate(p, nullptr);
  // One more allocation gives the allocator a chance to learn the frees completed.
  void* p = alloc_->allocate(512, nullptr);
  alloc_->deallocate(p, nullptr);
  core::DeviceStats st = alloc_->stats();
  EXPECT_LE(st.cached_bytes + st.pooled_bytes, 256 * MiB + 2 * MiB);
  EXPECT_GT(st.num_released_pages, 0u);
}

TEST_F(ReleaseTest, PeaksTrackAndReset) {
  make(sim_config(4 * GiB));
  void* a = alloc_->allocate(1 * GiB, nullptr);
  alloc_->deallocate(a, nullptr);
  core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.peak_requested_bytes, 1 * GiB);
  EXPECT_GE(st.peak_mapped_bytes, 1 * GiB);
  alloc_->reset_peaks();
  st = alloc_->stats();
  EXPECT_EQ(st.peak_requested_bytes, 0u);
  EXPECT_EQ(st.peak_mapped_bytes, st.mapped_bytes);
}

}  // namespace
}  // namespace expanse::test
