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

// What a capture freed in its pool serves the pool's next capture (graphs sharing a pool, as
// vLLM and SGLang capture every batch size into one, largest first) without a synchronize.
TEST_F(CaptureEndTest, ACapturesFreesInItsPoolServeTheNextCaptureIntoIt) {
  make(sim_config(64 * MiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  const auto& t = drv_->table();
  alloc_->create_pool(9);
  auto capture = [&](CUstream s, size_t bytes) {
    {
      PrimaryCtx c(t);
      EXPECT_EQ(t.stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    }
    void* p = alloc_->allocate(bytes, s, 9);
    alloc_->deallocate(p, s);
    PrimaryCtx c(t);
    CUgraph g = nullptr;
    EXPECT_EQ(t.stream_end_capture(s, &g), CUDA_SUCCESS);
    t.graph_destroy(g);
    return p;
  };
  void* first = capture(s1, 16 * MiB);
  alloc_->capture_ended(s1);
  const size_t physical = alloc_->pool_stats(9).physical_bytes;
  void* second = capture(s2, 8 * MiB);
  EXPECT_EQ(second, first) << "the second capture did not reuse the first one's memory";
  EXPECT_EQ(alloc_->pool_stats(9).physical_bytes, physical);
  alloc_->capture_ended(s2);
  alloc_->release_pool(9);
  alloc_->release_cached();
}

}  // namespace
}  // namespace expanse::test
