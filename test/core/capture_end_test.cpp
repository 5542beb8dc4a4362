// A block freed during a capture waits for the capture to end. When no later call names the
// capturing stream, only the application can say it ended (expanse_capture_end, or the end of a
// pool's capture routing): then a synchronize of the context proves the free done, and nothing
// is stranded, neither the block nor, through the synchronize it allows, a released pool.
#include "core_fixture.hpp"

namespace expanse::test {
namespace {

class CaptureEndTest : public CoreTest {
 protected:
  // Allocates 8 MiB on s, captures on s, frees the block inside the capture, ends the capture.
  void free_inside_a_capture(CUstream s) {
    const auto& t = drv_->table();
    void* p = alloc_->allocate(8 * MiB, s);
    {
      PrimaryCtx c(t);
      ASSERT_EQ(t.stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    }
    alloc_->deallocate(p, s);
    PrimaryCtx c(t);
    CUgraph g = nullptr;
    ASSERT_EQ(t.stream_end_capture(s, &g), CUDA_SUCCESS);
    t.graph_destroy(g);
  }
};

TEST_F(CaptureEndTest, WithoutWordOfTheEndTheFreeWaits) {
  make(sim_config(32 * MiB));
  CUstream s = new_stream();
  free_inside_a_capture(s);
  alloc_->release_cached();  // no synchronize: the capture may still be under way
  EXPECT_EQ(alloc_->stats().cached_bytes, 8 * MiB);
}

TEST_F(CaptureEndTest, WordOfTheEndLetsTheSynchronizeProveTheFreeDone) {
  make(sim_config(32 * MiB));
  CUstream s = new_stream();
  free_inside_a_capture(s);
  alloc_->capture_ended(s);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().cached_bytes, 0u) << alloc_->describe_stream_order(nullptr);
}

TEST_F(CaptureEndTest, AReleasedPoolReturnsOnceTheCaptureIsKnownToHaveEnded) {
  make(sim_config(32 * MiB));
  CUstream s = new_stream();
  alloc_->create_pool(5);
  CUstream other = new_stream();
  void* g = alloc_->allocate(8 * MiB, other, 5);
  alloc_->deallocate(g, other);
  free_inside_a_capture(s);  // the last call naming s
  alloc_->release_pool(5);
  alloc_->release_cached();
  EXPECT_TRUE(alloc_->has_pool(5)) << "returned while a capture might be under way";
  alloc_->capture_ended(s);
  alloc_->release_cached();
  EXPECT_FALSE(alloc_->has_pool(5));
  EXPECT_EQ(alloc_->stats().cached_bytes, 0u);
}

}  // namespace
}  // namespace expanse::test
