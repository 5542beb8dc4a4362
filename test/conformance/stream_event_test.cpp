// Rules for streams and events, including pending work on a held stream.
#include "conformance.hpp"

namespace expanse::conformance {
namespace {

// Stream flags ⊆ {DEFAULT, NON_BLOCKING}; others → INVALID_VALUE.
TEST_P(Conformance, StreamCreateBadFlagsIsInvalidValue) {
  make_current();
  CUstream s = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_create(&s, 2));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_create(&s, 0x10));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_create(nullptr, 0));
  const CUstream a = make_stream(CU_STREAM_DEFAULT);
  const CUstream b = make_stream(CU_STREAM_NON_BLOCKING);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_CU(CUDA_SUCCESS, destroy_stream(a));
  EXPECT_CU(CUDA_SUCCESS, destroy_stream(b));
}

// Stream and event creation need a current context.
TEST_P(Conformance, StreamAndEventCreateWithoutContextIsInvalidContext) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  CUstream s = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().stream_create(&s, 0));
  CUevent e = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().event_create(&e, 0));
}

// INTERPROCESS requires DISABLE_TIMING; unknown flags → INVALID_VALUE.
TEST_P(Conformance, EventCreateInterprocessWithoutDisableTimingIsInvalidValue) {
  make_current();
  CUevent e = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().event_create(&e, CU_EVENT_INTERPROCESS));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().event_create(&e, CU_EVENT_INTERPROCESS | CU_EVENT_BLOCKING_SYNC));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().event_create(&e, 0x40));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().event_create(nullptr, 0));
  const CUevent ok = make_event(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
  EXPECT_NE(ok, nullptr);
  EXPECT_CU(CUDA_SUCCESS, destroy_event(ok));
}

// Querying a never-recorded event is SUCCESS; so is synchronizing on it.
TEST_P(Conformance, EventQueryNeverRecordedIsSuccess) {
  const CUevent e = make_event(CU_EVENT_DEFAULT);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e));
}

// Record on an idle stream (created and default) completes; stream query of an idle stream
// is SUCCESS; a stream can wait on a completed event.
TEST_P(Conformance, EventRecordOnIdleStreamCompletes) {
  const CUstream s = make_stream();
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(s));
  EXPECT_CU(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().event_record(e, nullptr));  // the legacy default stream
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().stream_wait_event(s, e, 0));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(nullptr));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_synchronize());
}

// Sim hook: work on a held stream stays pending (NOT_READY) until the stream is released.
TEST_P(Conformance, HeldStreamIsNotReadyUntilReleased) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's held streams");
  const CUstream s = make_stream();
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(s);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().stream_query(s));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e)) << "querying does not complete work";
  // Another stream is unaffected.
  const CUstream other = make_stream();
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(other));
  hooks()->release_stream(s);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(s));
}

// Sim hook: waiting (stream/event synchronize) completes a held stream's work, as on a GPU.
TEST_P(Conformance, SynchronizeCompletesHeldWork) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's held streams");
  const CUstream s = make_stream();
  const CUevent e1 = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent e2 = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(s);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e1, s));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e1));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e1));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e2, s));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e2));
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e2));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e2));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e1, s));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().stream_query(s));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_synchronize());
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e1));
  hooks()->release_stream(s);
}

// An event and a stream of different contexts cannot be recorded together → INVALID_HANDLE.
TEST_P(Conformance, EventRecordAcrossContextsIsInvalidHandle) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices (two primary contexts)";
  const CUevent e0 = make_event(CU_EVENT_DISABLE_TIMING);  // device 0's context
  CUcontext ctx1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx1, dev(1)));
  ASSERT_CU(CUDA_SUCCESS, t().ctx_push_current(ctx1));
  CUstream s1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_create(&s1, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_record(e0, s1));
  EXPECT_CU(CUDA_SUCCESS, t().stream_destroy(s1));
  CUcontext popped = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().ctx_pop_current(&popped));
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
}

// A destroyed stream or event is an invalid handle (sim: a real driver may crash instead).
TEST_P(Conformance, DestroyedStreamOrEventIsInvalidHandle) {
  CONFORMANCE_REQUIRE_SIM("a destroyed handle may crash a real driver");
  const CUstream s = make_stream();
  const CUevent e = make_event();
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(s));
  ASSERT_CU(CUDA_SUCCESS, destroy_event(e));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().stream_synchronize(s));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().stream_query(s));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_query(e));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_synchronize(e));
  const CUevent live = make_event();
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_record(live, s));
}
}  // namespace
}  // namespace expanse::conformance
