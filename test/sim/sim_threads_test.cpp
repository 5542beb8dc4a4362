// Thread-safety smoke test: many threads driving the sim at once.
#include <atomic>
#include <thread>
#include <vector>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

using driver::EntryPoint;

class SimThreads : public SimTest {};

// A thread_local object constructed before the thread's first sim call is destroyed after the
// sim's own thread-local state (destructors run in reverse order of construction), as a static
// allocator destroyed at exit is after the main thread's thread_locals. Its driver calls must
// still work (the context stack was a std::vector, used after free here; ASan caught it through
// ~DeviceAllocator in the hot-path bench).
TEST_F(SimThreads, ContextCallsFromLateThreadLocalDestructorsWork) {
  struct LateUser {
    CUcontext ctx = nullptr;
    CUresult* results = nullptr;
    ~LateUser() {
      if (results == nullptr) return;
      const driver::DriverTable& d = table();
      results[0] = d.ctx_push_current(ctx);
      CUcontext popped = nullptr;
      results[1] = d.ctx_pop_current(&popped);
      results[2] = popped == ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
  };
  CUresult results[3] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN};
  const CUcontext ctx = make_current(0);
  std::thread t([&] {
    thread_local LateUser late;  // constructed first: destroyed last
    late.ctx = ctx;
    late.results = results;
    const driver::DriverTable& d = table();
    ASSERT_EQ(CUDA_SUCCESS, d.ctx_push_current(ctx));  // the sim's thread-local state now exists
    ASSERT_EQ(CUDA_SUCCESS, d.ctx_pop_current(nullptr));
  });
  t.join();
  EXPECT_EQ(CUDA_SUCCESS, results[0]);
  EXPECT_EQ(CUDA_SUCCESS, results[1]);
  EXPECT_EQ(CUDA_SUCCESS, results[2]);
}

// cuStreamIsCapturing is answered without the lock from a cached "not capturing", but never
// stale: a capture begun on the stream, a stream forked into a capture, and a blocking capture
// that makes the legacy stream answer CAPTURE_IMPLICIT all show at once; every call counts.
TEST_F(SimThreads, IsCapturingWithoutTheLockIsNeverStale) {
  make_current(0);
  CUstream s = nullptr, side = nullptr, blocking = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_create(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_create(&side, CU_STREAM_NON_BLOCKING));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_create(&blocking, CU_STREAM_DEFAULT));
  auto status = [&](CUstream x, CUresult* r = nullptr) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    const CUresult got = t().stream_is_capturing(x, &st);
    if (r != nullptr) *r = got;
    return st;
  };
  const uint64_t before = call_count(EntryPoint::stream_is_capturing);
  for (int i = 0; i < 3; ++i) {  // the first locked, then cached
    EXPECT_EQ(status(s), CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT_EQ(status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT_EQ(status(nullptr), CU_STREAM_CAPTURE_STATUS_NONE);
  }
  EXPECT_EQ(call_count(EntryPoint::stream_is_capturing), before + 9);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(status(side), CU_STREAM_CAPTURE_STATUS_NONE);
  CUevent e = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().event_create(&e, CU_EVENT_DISABLE_TIMING));
  ASSERT_EQ(CUDA_SUCCESS, t().event_record(e, s));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_wait_event(side, e, 0));  // side joins the capture
  EXPECT_EQ(status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_EQ(CUDA_SUCCESS, t().event_record(e, side));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_wait_event(s, e, 0));  // joined back
  CUgraph g = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_end_capture(s, &g));
  t().graph_destroy(g);
  EXPECT_EQ(status(s), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(status(side), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(status(nullptr), CU_STREAM_CAPTURE_STATUS_NONE);  // cached again
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUresult r = CUDA_SUCCESS;
  (void)status(nullptr, &r);
  EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) << "a stale cached answer for the legacy stream";
  ASSERT_EQ(CUDA_SUCCESS, t().stream_end_capture(blocking, &g));
  t().graph_destroy(g);
  t().event_destroy(e);
  for (CUstream x : {s, side, blocking}) t().stream_destroy(x);
}

TEST_F(SimThreads, ConcurrentLifecycles) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  std::atomic<int> failures{0};
  reset_counts();
  auto worker = [&](int id) {
    const driver::DriverTable& d = table();
    const int dev = id % 2;
    CUdevice cu_dev = -1;
    CUcontext ctx = nullptr;
    if (d.device_get(&cu_dev, dev) != CUDA_SUCCESS ||
        d.device_primary_ctx_retain(&ctx, cu_dev) != CUDA_SUCCESS ||
        d.ctx_set_current(ctx) != CUDA_SUCCESS) {
      ++failures;
      return;
    }
    CUstream s = nullptr;
    CUevent e = nullptr;
    if (d.stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        d.event_create(&e, 0) != CUDA_SUCCESS) {
      ++failures;
      return;
    }
    const CUmemAllocationProp prop = device_prop(dev);
    const CUmemAccessDesc rw = access(dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    for (int r = 0; r < kRounds; ++r) {
      CUdeviceptr va = 0;
      CUmemGenericAllocationHandle h = 0;
      const size_t size = 2 * MiB * static_cast<size_t>(1 + (r % 3));
      bool ok = d.mem_address_reserve(&va, size, 0, 0, 0) == CUDA_SUCCESS;
      ok = ok && d.mem_create(&h, size, &prop, 0) == CUDA_SUCCESS;
      ok = ok && d.mem_map(va, size, 0, h, 0) == CUDA_SUCCESS;
      ok = ok && d.mem_set_access(va, size, &rw, 1) == CUDA_SUCCESS;
      if (ok) {
        auto* p = as_ptr<int>(va);
        p[0] = id * 100000 + r;
        ok = p[0] == id * 100000 + r;
      }
      ok = ok && d.event_record(e, s) == CUDA_SUCCESS && d.event_synchronize(e) == CUDA_SUCCESS;
      size_t free_bytes = 0;
      ok = ok && d.mem_get_info(&free_bytes, nullptr) == CUDA_SUCCESS;
      ok = ok && d.mem_unmap(va, size) == CUDA_SUCCESS;
      ok = ok && d.mem_release(h) == CUDA_SUCCESS;
      ok = ok && d.mem_address_free(va, size) == CUDA_SUCCESS;
      if (!ok) ++failures;
    }
    if (d.event_destroy(e) != CUDA_SUCCESS || d.stream_destroy(s) != CUDA_SUCCESS) ++failures;
    if (d.device_primary_ctx_release(cu_dev) != CUDA_SUCCESS) ++failures;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
  EXPECT_TRUE(outstanding().empty()) << describe_outstanding();
  EXPECT_EQ(0u, outstanding().streams);
  EXPECT_EQ(uint64_t{kThreads} * kRounds, call_count(EntryPoint::mem_map));
  EXPECT_EQ(uint64_t{kThreads} * kRounds, call_count(EntryPoint::mem_create));
  EXPECT_EQ(uint64_t{kThreads}, call_count(EntryPoint::stream_create));
}

TEST_F(SimThreads, InjectionUnderContention) {
  constexpr int kThreads = 4;
  constexpr int kCalls = 500;
  inject_failure(EntryPoint::device_get_count, 1000, CUDA_ERROR_UNKNOWN);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      int n = 0;
      for (int c = 0; c < kCalls; ++c) {
        if (table().device_get_count(&n) != CUDA_SUCCESS) ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(1, failed.load());  // exactly the 1000th call
  EXPECT_EQ(uint64_t{kThreads} * kCalls, call_count(EntryPoint::device_get_count));
}

}  // namespace
}  // namespace expanse::sim::testing
