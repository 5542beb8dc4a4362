// Streams and events, and holding work pending (hold_stream / release_stream).
#include <stdexcept>
#include <string>
#include <thread>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

class SimStream : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    ctx_ = make_current(0);
  }
  CUstream stream(unsigned flags = 0) {
    CUstream s = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().stream_create(&s, flags));
    return s;
  }
  CUevent event(unsigned flags = 0) {
    CUevent e = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().event_create(&e, flags));
    return e;
  }
  CUcontext ctx_ = nullptr;
};

TEST_F(SimStream, CreateRules) {
  CUstream s = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().stream_create(&s, 2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().stream_create(nullptr, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_create(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(1u, outstanding().streams);
  EXPECT_EQ(CUDA_SUCCESS, t().stream_destroy(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_destroy(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_destroy(nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_synchronize(reinterpret_cast<CUstream>(0x1000)));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_query(reinterpret_cast<CUstream>(0x1000)));
  CUevent e = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().event_create(&e, 8));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().event_create(&e, CU_EVENT_INTERPROCESS));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().event_create(nullptr, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().event_create(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  EXPECT_EQ(CUDA_SUCCESS, t().event_destroy(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().event_destroy(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().event_query(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().event_synchronize(e));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().event_record(e, nullptr));
  EXPECT_EQ(0u, outstanding().streams);
  EXPECT_EQ(0u, outstanding().events);
}

TEST_F(SimStream, NeedContext) {
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  CUstream s = nullptr;
  CUevent e = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_create(&s, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().event_create(&e, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_synchronize(nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_query(CU_STREAM_LEGACY));
}

TEST_F(SimStream, EventsCompleteAtOnceByDefault) {
  const CUstream s = stream();
  const CUevent e = event();
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));  // never recorded
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, nullptr));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, CU_STREAM_LEGACY));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, CU_STREAM_PER_THREAD));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(CUDA_SUCCESS, t().event_synchronize(e));
  EXPECT_EQ(0u, pending_events());
  EXPECT_EQ(CUDA_SUCCESS, t().event_destroy(e));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_destroy(s));
}

TEST_F(SimStream, HeldStreamUntilReleased) {
  const CUstream s = stream();
  const CUevent e = event();
  hold_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));  // nothing recorded yet
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().stream_query(s));
  EXPECT_EQ(1u, pending_events());
  release_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
  EXPECT_EQ(0u, pending_events());
  EXPECT_THROW(hold_stream(reinterpret_cast<CUstream>(0x1000)), std::invalid_argument);
}

TEST_F(SimStream, SynchronizeCompletesHeldWork) {
  const CUstream s = stream();
  const CUevent e1 = event();
  const CUevent e2 = event();
  hold_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e1, s));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e2, s));
  // Waiting for e1 completes e1 and what came before it, not e2.
  EXPECT_EQ(CUDA_SUCCESS, t().event_synchronize(e1));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e1));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e2));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e2));
  // Still held: new work is pending again; the context synchronize completes everything.
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e1, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e1));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_synchronize());
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e1));
  // Re-recording overwrites: the event follows its latest record.
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e1, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e1));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e1, nullptr));  // the NULL stream waits for s (legacy)
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e1));
  release_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e1));
  EXPECT_EQ(0u, pending_events());
}

TEST_F(SimStream, WaitEventChainsStreams) {
  const CUstream a = stream(CU_STREAM_NON_BLOCKING);
  const CUstream b = stream(CU_STREAM_NON_BLOCKING);
  const CUevent ea = event();
  const CUevent eb = event();
  const CUevent eb0 = event();
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(eb0, b));
  hold_stream(a);
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(ea, a));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_wait_event(b, ea, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(eb, b));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(eb0));  // before the wait
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(eb));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().stream_query(b));
  EXPECT_EQ(2u, pending_events());
  // Synchronizing b waits for a's event too.
  EXPECT_EQ(CUDA_SUCCESS, t().stream_synchronize(b));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(eb));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(ea));
  // Release path: the wait resolves when a is released.
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(ea, a));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_wait_event(b, ea, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(eb, b));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(eb));
  release_stream(a);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(eb));
  // Waiting on a completed or never-recorded event is a no-op.
  const CUevent fresh = event();
  EXPECT_EQ(CUDA_SUCCESS, t().stream_wait_event(b, fresh, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(b));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().stream_wait_event(b, ea, 2));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE,
            t().stream_wait_event(b, reinterpret_cast<CUevent>(0x40), 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE,
            t().stream_wait_event(reinterpret_cast<CUstream>(0x40), ea, 0));
}

TEST_F(SimStream, NonBlockingStreamsIgnoreTheLegacyStream) {
  const CUstream blocking = stream(0);
  const CUstream non_blocking = stream(CU_STREAM_NON_BLOCKING);
  const CUevent e_legacy = event();
  const CUevent e_nb = event();
  const CUevent e_b = event();
  hold_stream(nullptr);
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e_legacy, nullptr));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e_nb, non_blocking));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e_b, blocking));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e_legacy));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e_nb));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e_b));  // a blocking stream waits for NULL
  release_stream(nullptr);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e_legacy));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e_b));
}

TEST_F(SimStream, DestroyedStreamStillCompletesItsWork) {
  const CUstream s = stream();
  const CUevent e = event();
  hold_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_destroy(s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e));
  EXPECT_EQ(CUDA_SUCCESS, t().event_synchronize(e));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));
  EXPECT_EQ(0u, outstanding().streams);
}

TEST_F(SimStream, StreamAndEventOfDifferentDevices) {
  const CUevent e0 = event();
  CUcontext c1 = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&c1, dev(1)));
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_push_current(c1));
  const CUstream s1 = stream();
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().event_record(e0, s1));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_wait_event(s1, e0, 0));  // cross-device waits are fine
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_pop_current(nullptr));
  // Releasing device 1's primary context destroys its streams.
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
  EXPECT_EQ(CUDA_ERROR_CONTEXT_IS_DESTROYED, t().stream_query(s1));
  EXPECT_EQ(0u, outstanding().streams);
}

TEST_F(SimStream, CtxSynchronizeCompletesOnlyItsDevice) {
  const CUstream s0 = stream();
  const CUevent e0 = event();
  CUcontext c1 = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&c1, dev(1)));
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_push_current(c1));
  const CUstream s1 = stream();
  const CUevent e1 = event();
  hold_stream(s0);
  hold_stream(s1);
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e0, s0));
  EXPECT_EQ(CUDA_SUCCESS, t().event_record(e1, s1));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_synchronize());  // device 1
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e1));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e0));
  EXPECT_EQ(CUDA_SUCCESS, sim_ctx_synchronize_v2(ctx_));  // device 0, by handle
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e0));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, sim_ctx_synchronize_v2(reinterpret_cast<CUcontext>(0x10)));
}

// Which call invalidated a capture is remembered (capture_log), for tests that must say why a
// capture ended invalidated: a context sync from another thread breaks a THREAD_LOCAL capture too.
TEST_F(SimStream, CaptureLogNamesTheCallThatInvalidatedTheCapture) {
  EXPECT_EQ(capture_log(), "");
  CUstream s = stream(CU_STREAM_NON_BLOCKING);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUresult sync = CUDA_SUCCESS;
  std::thread other([&] {
    make_current(0);
    sync = t().ctx_synchronize();
  });
  other.join();
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, sync);
  CUgraph g = nullptr;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, t().stream_end_capture(s, &g));
  const std::string log = capture_log();
  EXPECT_NE(log.find("(THREAD_LOCAL, device 0"), std::string::npos) << log;
  EXPECT_NE(log.find("invalidated by cuCtxSynchronize on thread"), std::string::npos) << log;
  EXPECT_EQ(log.find("(the capturing thread)"), std::string::npos) << log;
  EXPECT_EQ(CUDA_SUCCESS, t().stream_destroy(s));
}

}  // namespace
}  // namespace expanse::sim::testing
