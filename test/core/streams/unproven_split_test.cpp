// A split of the calling stream's own freed memory whose work is still pending (the GPU behind
// the host) waits for that stream's work only: one fence on the stream, no context synchronize,
// which from this thread would complete other streams' work needlessly and invalidate another
// thread's global capture (test/gpu/RESULTS.md: measured on an H100).
#include "core_fixture.hpp"

#include <thread>

namespace expanse::test {
namespace {

using driver::EntryPoint;

class UnprovenSplitTest : public CoreTest {
 protected:
  // Stream t freed a block nobody wanted (no fence); s freed a 64 MiB block (one handle) while
  // its work runs. A 20 MiB allocation on s then needs a split of that handle.
  void setup(CUstream& s, CUstream& t) {
    make(sim_config(8 * GiB, false));
    s = new_stream();
    t = new_stream();
    alloc_->deallocate(alloc_->allocate(4 * MiB, t), t);
    void* x = alloc_->allocate(64 * MiB, s);
    sim::hold_stream(s);
    alloc_->deallocate(x, s);
    x_ = x;
  }
  void* x_ = nullptr;
};

TEST_F(UnprovenSplitTest, WaitsForItsOwnStreamOnlyAndSynchronizesNoContext) {
  CUstream s = nullptr, t = nullptr;
  setup(s, t);
  sim::hold_stream(t);
  const uint64_t ctx_syncs = sim::call_count(EntryPoint::ctx_synchronize);
  const uint64_t event_syncs = sim::call_count(EntryPoint::event_synchronize);
  void* z = alloc_->allocate(20 * MiB, s);
  EXPECT_EQ(sim::call_count(EntryPoint::ctx_synchronize) - ctx_syncs, 0u)
      << "an allocation on s synchronized the whole context";
  EXPECT_LE(sim::call_count(EntryPoint::event_synchronize) - event_syncs, 1u);
  EXPECT_EQ(z, x_) << "the best fit: s's own memory, once its work is proven done";
  EXPECT_EQ(alloc_->check_invariants(), "");
  alloc_->deallocate(z, s);
  sim::release_all();
}

TEST_F(UnprovenSplitTest, AnAllocationOnAnotherThreadLeavesACaptureValid) {
  CUstream s = nullptr, t = nullptr;
  setup(s, t);
  CUstream cap = new_stream();
  const auto& tb = drv_->table();
  PrimaryCtx ctx(tb);
  ASSERT_EQ(tb.stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* z = nullptr;
  std::thread other([&] {
    PrimaryCtx c2(tb);
    z = alloc_->allocate(20 * MiB, s);
  });
  other.join();
  CUgraph g = nullptr;
  EXPECT_EQ(tb.stream_end_capture(cap, &g), CUDA_SUCCESS)
      << "another thread's allocation invalidated the capture";
  if (g != nullptr) tb.graph_destroy(g);
  ASSERT_NE(z, nullptr);
  alloc_->deallocate(z, s);
  sim::release_all();
}

}  // namespace
}  // namespace expanse::test
