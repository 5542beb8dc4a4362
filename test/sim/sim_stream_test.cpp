// Streams and events, and holding work pending (hold_stream / release_stream).
#include <stdexcept>
#include <string>
#include <thread>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

using driver::EntryPoint;

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

// cuStreamGetId answers without the global lock once a thread has asked about a handle
// (sim_fast_path.cpp); it must answer exactly what the locked call would.
TEST_F(SimStream, StreamIdWithoutTheLockAnswersWhatTheLockedCallWould) {
  CUstream s = stream(CU_STREAM_NON_BLOCKING);
  CUstream other = stream(CU_STREAM_NON_BLOCKING);
  unsigned long long other_id = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(other, &other_id));
  unsigned long long id = 0, again = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(s, &id));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(s, &again));  // from the cache
  EXPECT_EQ(id, again);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().stream_get_id(s, nullptr));
  // Destroyed: the cached answer is gone.
  ASSERT_EQ(CUDA_SUCCESS, t().stream_destroy(s));
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_get_id(s, &again));
  // Recycled: the same value names a new stream, with a new id, also from another thread that
  // had cached the old answer.
  CUstream r = stream(CU_STREAM_NON_BLOCKING);
  ASSERT_EQ(s, r) << "the sim recycles the last destroyed handle";
  unsigned long long rid = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &rid));
  EXPECT_NE(rid, id);
  unsigned long long seen = 0;
  std::thread([&] {
    ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(other, &seen));  // cached on this thread now
    ASSERT_EQ(CUDA_SUCCESS, t().stream_destroy(other));
  }).join();
  EXPECT_EQ(seen, other_id);
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, t().stream_get_id(other, &seen));
  // Injected failures still fire on a cached handle, and count like the locked calls.
  reset_counts();
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &seen));
  inject_failure(EntryPoint::stream_get_id, 2, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &seen));
  EXPECT_EQ(CUDA_ERROR_UNKNOWN, t().stream_get_id(r, &seen));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &seen));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &seen));
  EXPECT_EQ(5u, call_count(EntryPoint::stream_get_id));
  // And are priced: 5 calls at 700 ns.
  CostTable c;
  c.set_flat(EntryPoint::stream_get_id, 700);
  set_cost_table(c);
  reset_counts();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(r, &seen));
  EXPECT_EQ(5u, call_count(EntryPoint::stream_get_id));
  EXPECT_EQ(5u, total_calls());
  EXPECT_NEAR(3.5e-6, modeled_seconds(), 1e-12);
  set_cost_table(CostTable::get_default());
  EXPECT_EQ(CUDA_SUCCESS, t().stream_destroy(r));
}

// A context reset takes its streams with it: a cached answer does not outlive it.
TEST_F(SimStream, StreamIdAfterContextResetIsContextDestroyed) {
  CUstream s = stream(CU_STREAM_NON_BLOCKING);
  unsigned long long id = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(s, &id));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(s, &id));
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_release(dev(0)));  // the last reference: reset
  EXPECT_EQ(CUDA_ERROR_CONTEXT_IS_DESTROYED, t().stream_get_id(s, &id));
}

// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the calling thread's streams of its
// current context: cached answers follow the context (switched, released, none) and the thread.
TEST_F(SimStream, StreamIdOfTheDefaultStreamsFollowsTheCurrentContext) {
  const CUstream kLegacy = reinterpret_cast<CUstream>(0x1);
  const CUstream kPerThread = reinterpret_cast<CUstream>(0x2);
  unsigned long long null0 = 0, legacy0 = 0, pt0 = 0, again = 0;
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(nullptr, &null0));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kLegacy, &legacy0));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kPerThread, &pt0));
  EXPECT_EQ(null0, legacy0);
  EXPECT_NE(legacy0, pt0);
  for (int i = 0; i < 2; ++i) {  // cached now
    ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(nullptr, &again));
    EXPECT_EQ(again, null0);
    ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kPerThread, &again));
    EXPECT_EQ(again, pt0);
  }
  // Another thread, same context: its own per-thread stream, the same legacy stream.
  unsigned long long their_pt = 0, their_legacy = 0;
  std::thread([&] {
    ASSERT_EQ(CUDA_SUCCESS, t().ctx_set_current(ctx_));
    ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kPerThread, &their_pt));
    ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kLegacy, &their_legacy));
  }).join();
  EXPECT_NE(their_pt, pt0);
  EXPECT_EQ(their_legacy, legacy0);
  // No current context: INVALID_CONTEXT, whatever was cached.
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_get_id(nullptr, &again));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_get_id(kPerThread, &again));
  // Back, then released to zero references (a reset): the streams are new ones after a retain.
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_set_current(ctx_));
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kPerThread, &again));
  EXPECT_EQ(again, pt0);
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_release(dev(0)));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_get_id(kPerThread, &again));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().stream_get_id(nullptr, &again));
  ctx_ = make_current(0);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_get_id(kPerThread, &again));
  EXPECT_NE(again, pt0) << "the per-thread stream of a reset context is a new stream";
}

}  // namespace
}  // namespace expanse::sim::testing
