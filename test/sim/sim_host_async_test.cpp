// Pinned host memory and stream-ordered copies in the sim: a copy on a held stream moves its
// bytes only when the stream's work completes (release, stream/event/context synchronize), in
// stream order and after the work it waits for; pageable memory is staged (HtoD) or waited for
// (DtoH); cuMemFreeHost completes the copies that touch the buffer; a copy whose range was
// unmapped before it ran is skipped and counted; pinned host memory is accounted and reported.
#include <cstring>
#include <vector>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

class SimHostAsync : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    make_current(0);
    buf_ = make_buffer(gran_);
  }
  CUstream stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
    CUstream s = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().stream_create(&s, flags));
    return s;
  }
  unsigned char* pinned(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().mem_host_alloc(&p, n, 0));
    return static_cast<unsigned char*>(p);
  }
  unsigned char* dev() const { return as_ptr<unsigned char>(buf_.va); }
  Buffer buf_;
};

TEST_F(SimHostAsync, HtoDOnHeldStreamLandsOnlyWhenReleased) {
  const CUstream s = stream();
  unsigned char* h = pinned(4096);
  std::memset(h, 0x11, 4096);
  std::memset(dev(), 0, 4096);
  hold_stream(s);
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 4096, s));
  EXPECT_EQ(dev()[0], 0) << "a copy on a held stream ran at the call";
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().stream_query(s));
  // A pinned source is read when the copy runs, not at the call (a DMA engine reads it then).
  std::memset(h, 0x22, 4096);
  release_stream(s);
  EXPECT_EQ(dev()[0], 0x22);
  EXPECT_EQ(dev()[4095], 0x22);
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

TEST_F(SimHostAsync, CopiesRunInStreamOrderWhenSynchronized) {
  const CUstream s = stream();
  unsigned char* h = pinned(64);
  std::memset(dev(), 0x01, 64);
  hold_stream(s);
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va, 0x7E, 64, s));
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_dtoh_async(h, buf_.va, 64, s));
  EXPECT_EQ(dev()[0], 0x01);
  EXPECT_EQ(h[0], 0) << "the DtoH ran before the memset it follows";
  ASSERT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));  // completes held work, in order
  EXPECT_EQ(dev()[0], 0x7E);
  EXPECT_EQ(h[63], 0x7E);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

TEST_F(SimHostAsync, EventAndContextSynchronizeCompleteHeldCopies) {
  const CUstream s = stream();
  unsigned char* h = pinned(64);
  std::memset(h, 0x33, 64);
  std::memset(dev(), 0, 128);
  CUevent e = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().event_create(&e, 0));
  hold_stream(s);
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 64, s));
  ASSERT_EQ(CUDA_SUCCESS, t().event_record(e, s));
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va + 64, 0x44, 64, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e));
  ASSERT_EQ(CUDA_SUCCESS, t().event_synchronize(e));
  EXPECT_EQ(dev()[0], 0x33) << "work before the event completes with it";
  EXPECT_EQ(dev()[64], 0) << "work after the event stays pending";
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_synchronize());
  EXPECT_EQ(dev()[64], 0x44);
  EXPECT_EQ(CUDA_SUCCESS, t().event_destroy(e));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

// A copy on stream B that waits (cuStreamWaitEvent) for held stream A runs only after A's work.
TEST_F(SimHostAsync, CopyWaitingOnAnotherHeldStreamWaitsForIt) {
  const CUstream a = stream();
  const CUstream b = stream();
  unsigned char* h = pinned(64);
  std::memset(dev(), 0, 64);
  CUevent e = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().event_create(&e, 0));
  hold_stream(a);
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va, 0x55, 64, a));
  ASSERT_EQ(CUDA_SUCCESS, t().event_record(e, a));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_wait_event(b, e, 0));
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_dtoh_async(h, buf_.va, 64, b));
  EXPECT_EQ(h[0], 0) << "B's copy ran before A's memset it waits for";
  release_stream(a);
  EXPECT_EQ(h[0], 0x55);
  EXPECT_EQ(CUDA_SUCCESS, t().event_destroy(e));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

// Pageable memory: an HtoD reads its source at the call (staging), a DtoH waits for its stream
// (completing a held stream's earlier work, as a synchronize does) and is done on return.
TEST_F(SimHostAsync, PageableHtoDIsStagedAndDtoHWaitsForTheStream) {
  const CUstream s = stream();
  std::vector<unsigned char> src(64, 0x66);
  std::memset(dev(), 0, 128);
  hold_stream(s);
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, src.data(), src.size(), s));
  std::fill(src.begin(), src.end(), 0x00);  // the caller may reuse a pageable source at once
  EXPECT_EQ(dev()[0], 0);
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va + 64, 0x77, 64, s));
  std::vector<unsigned char> out(128, 0);
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_dtoh_async(out.data(), buf_.va, out.size(), s));
  EXPECT_EQ(out[0], 0x66) << "the staged source, not the buffer as it is now";
  EXPECT_EQ(out[64], 0x77) << "the DtoH did not wait for the stream's earlier work";
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
  release_stream(s);
}

// cuMemFreeHost completes the pending copies that touch the buffer (they never run on freed
// memory), and only those.
TEST_F(SimHostAsync, FreeHostCompletesPendingCopiesOfTheBuffer) {
  const CUstream s = stream();
  const CUstream other = stream();
  unsigned char* h = pinned(64);
  std::memset(h, 0x12, 64);
  std::memset(dev(), 0, 256);
  hold_stream(s);
  hold_stream(other);
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va + 128, 0x34, 64, other));
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 64, s));
  ASSERT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
  EXPECT_EQ(dev()[0], 0x12) << "freeing pinned memory completes the copies that read it";
  EXPECT_EQ(dev()[128], 0) << "work on another stream, touching other memory, stays pending";
  release_all();
  EXPECT_EQ(dev()[128], 0x34);
  EXPECT_EQ(0u, outstanding().host_allocations);
}

// A copy whose device range is unmapped before its held stream runs it is a fault on a GPU:
// the sim skips it and counts it.
TEST_F(SimHostAsync, CopyIntoRangeUnmappedBeforeItRunsIsCountedAsAFault) {
  const CUstream s = stream();
  unsigned char* h = pinned(64);
  hold_stream(s);
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 64, s));
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va, 1, 64, s));
  EXPECT_EQ(0u, async_faults());
  free_buffer(buf_);
  release_stream(s);
  EXPECT_EQ(2u, async_faults());
  buf_ = make_buffer(gran_);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

// Captured copies never run, not even when the stream is later synchronized.
TEST_F(SimHostAsync, CapturedCopyNeverRuns) {
  const CUstream s = stream();
  unsigned char* h = pinned(64);
  std::memset(h, 0x5C, 64);
  std::memset(dev(), 0, 64);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 64, s));
  CUgraph g = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_end_capture(s, &g));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(dev()[0], 0);
  EXPECT_EQ(CUDA_SUCCESS, t().graph_destroy(g));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

// During another thread's GLOBAL capture (simulated here by this thread's own capture, which
// forbids unsafe calls the same way), pinned copies on another stream are allowed, pageable
// ones and cuMemHostAlloc are "potentially unsafe".
TEST_F(SimHostAsync, PinnedCopiesAreNotUnsafeDuringCapture) {
  const CUstream cap = stream();
  const CUstream s = stream();
  unsigned char* h = pinned(64);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 64, s));
  EXPECT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf_.va, 0, 64, s));
  std::vector<unsigned char> pageable(64);
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            t().memcpy_dtoh_async(pageable.data(), buf_.va, 64, s));
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, t().stream_end_capture(cap, &g));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* p = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().mem_host_alloc(&p, 64, 0));
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, t().stream_end_capture(cap, &g));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

// Pinned host memory appears in outstanding() and describe_outstanding(), so leaks show.
TEST_F(SimHostAsync, PinnedMemoryIsAccountedAndLeaksShow) {
  EXPECT_TRUE(outstanding().host_allocations == 0);
  unsigned char* a = pinned(1000);
  unsigned char* b = pinned(3 * MiB);
  const Outstanding o = outstanding();
  EXPECT_EQ(2u, o.host_allocations);
  EXPECT_EQ(1000 + 3 * MiB, o.host_bytes);
  EXPECT_EQ(o.host_allocations, outstanding(1).host_allocations) << "reported for every device";
  EXPECT_NE(describe_outstanding().find("2 pinned host allocations"), std::string::npos)
      << describe_outstanding();
  EXPECT_NE(describe_outstanding().find("pinned host allocation 0x"), std::string::npos);
  a[999] = 1;  // usable to its last byte
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(a));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(b));
  free_buffer(buf_);
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
  buf_ = make_buffer(gran_);
  // A leaked allocation keeps outstanding() from being empty.
  pinned(64);
  free_buffer(buf_);
  EXPECT_FALSE(outstanding().empty());
  buf_ = make_buffer(gran_);
}

// Each call costs its per-call part plus its bytes at the modeled bandwidth.
TEST_F(SimHostAsync, ModeledCostGrowsWithBytes) {
  unsigned char* h = pinned(gran_);
  reset_counts();
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, 4096, nullptr));
  const double small = modeled_seconds();
  reset_counts();
  ASSERT_EQ(CUDA_SUCCESS, t().memcpy_htod_async(buf_.va, h, gran_, nullptr));
  const double big = modeled_seconds();
  EXPECT_GT(big, small * 5);
  // 2 MiB at 25 GB/s is ~84 us.
  EXPECT_NEAR(big, 4e-6 + 2 * 41.94e-6, 2e-6);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_free_host(h));
}

}  // namespace
}  // namespace expanse::sim::testing
