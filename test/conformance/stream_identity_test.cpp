// Rules for what a stream is: the context it belongs to, its unique id, per-thread
// default streams, the legacy stream's implicit synchronization, recycled handle values, and
// CUdevice values that are not ordinals.
#include "conformance.hpp"

#include <thread>

namespace expanse::conformance {
namespace {

// A second context: device 1's primary context, pushed on this thread. Undone by pop().
struct SecondContext {
  const driver::DriverTable& t;
  CUdevice dev;
  CUcontext ctx = nullptr;
  SecondContext(const driver::DriverTable& table, CUdevice d) : t(table), dev(d) {
    if (t.device_primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS) t.ctx_push_current(ctx);
  }
  ~SecondContext() {
    CUcontext popped = nullptr;
    t.ctx_pop_current(&popped);
    t.device_primary_ctx_release(dev);
  }
};

// cuStreamGetCtx names the context current at the stream's creation, whatever is current now;
// the special streams name the current context's.
TEST_P(Conformance, StreamRemembersItsContext) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const CUcontext ctx0 = make_current();
  const CUstream s0 = make_stream();
  CUcontext got = nullptr;
  {
    SecondContext second(t(), dev(1));
    ASSERT_NE(second.ctx, ctx0);
    CUstream s1 = nullptr;
    ASSERT_CU(CUDA_SUCCESS, t().stream_create(&s1, 0));
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_ctx(s0, &got));
    EXPECT_EQ(got, ctx0) << "a stream belongs to the context of its creation";
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_ctx(s1, &got));
    EXPECT_EQ(got, second.ctx);
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_ctx(CU_STREAM_PER_THREAD, &got));
    EXPECT_EQ(got, second.ctx);
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_ctx(nullptr, &got));
    EXPECT_EQ(got, second.ctx);
    EXPECT_CU(CUDA_SUCCESS, t().stream_destroy(s1));
  }
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_get_ctx(s0, nullptr));
}

// An event and a stream of different contexts: cuEventRecord is INVALID_HANDLE, for a created
// stream and for the legacy stream of the other (current) context; cuStreamWaitEvent across
// contexts works.
TEST_P(Conformance, EventRecordNeedsTheStreamsContextWaitDoesNot) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const CUevent e0 = make_event(CU_EVENT_DISABLE_TIMING);
  const CUstream s0 = make_stream();
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e0, s0));
  SecondContext second(t(), dev(1));
  CUstream s1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_create(&s1, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_record(e0, s1));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_record(e0, nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().event_record(e0, CU_STREAM_PER_THREAD));
  EXPECT_CU(CUDA_SUCCESS, t().event_record(e0, s0)) << "the event's own context's stream";
  EXPECT_CU(CUDA_SUCCESS, t().stream_wait_event(s1, e0, 0));
  EXPECT_CU(CUDA_SUCCESS, t().stream_wait_event(nullptr, e0, 0));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(s1));
  EXPECT_CU(CUDA_SUCCESS, t().stream_destroy(s1));
}

// Sim: a stream of context 1 waiting on held work of context 0 does not finish before it.
TEST_P(Conformance, CrossContextWaitOrdersWork) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  const CUevent e0 = make_event(CU_EVENT_DISABLE_TIMING);
  const CUstream s0 = make_stream();
  hooks()->hold_stream(s0);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e0, s0));
  {
    SecondContext second(t(), dev(1));
    CUstream s1 = nullptr;
    CUevent e1 = nullptr;
    ASSERT_CU(CUDA_SUCCESS, t().stream_create(&s1, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(CUDA_SUCCESS, t().event_create(&e1, CU_EVENT_DISABLE_TIMING));
    ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(s1, e0, 0));
    ASSERT_CU(CUDA_SUCCESS, t().event_record(e1, s1));
    EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e1)) << "waits for context 0's work";
    hooks()->release_stream(s0);
    EXPECT_CU(CUDA_SUCCESS, t().event_query(e1));
    EXPECT_CU(CUDA_SUCCESS, t().event_destroy(e1));
    EXPECT_CU(CUDA_SUCCESS, t().stream_destroy(s1));
  }
}

// cuStreamGetId: unique per stream, never reused (even when a handle value is), the legacy
// stream and each thread's per-thread stream have their own.
TEST_P(Conformance, StreamIdsAreUnique) {
  if (t().stream_get_id == nullptr) GTEST_SKIP() << "cuStreamGetId needs a 12.0 driver";
  const CUstream a = make_stream();
  const CUstream b = make_stream(CU_STREAM_NON_BLOCKING);
  unsigned long long ia = 0, ib = 0, legacy = 0, legacy2 = 0, pt = 0, pt2 = 0, pt_other = 0;
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(a, &ia));
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(b, &ib));
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(nullptr, &legacy));
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(CU_STREAM_LEGACY, &legacy2));
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(CU_STREAM_PER_THREAD, &pt));
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(CU_STREAM_PER_THREAD, &pt2));
  EXPECT_NE(ia, ib);
  EXPECT_EQ(legacy, legacy2);
  EXPECT_EQ(pt, pt2);
  EXPECT_NE(pt, legacy) << "the per-thread stream is not the legacy stream";
  EXPECT_NE(pt, ia);
  const CUcontext ctx = make_current();
  CUresult other_r = CUDA_ERROR_UNKNOWN;
  std::thread other([&] {
    t().ctx_set_current(ctx);
    other_r = t().stream_get_id(CU_STREAM_PER_THREAD, &pt_other);
    t().ctx_set_current(nullptr);
  });
  other.join();
  ASSERT_CU(CUDA_SUCCESS, other_r);
  EXPECT_NE(pt_other, pt) << "one per-thread stream per thread";
  // A new stream that may get a's handle value gets a new id.
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(a));
  const CUstream c = make_stream();
  unsigned long long ic = 0;
  ASSERT_CU(CUDA_SUCCESS, t().stream_get_id(c, &ic));
  EXPECT_NE(ic, ia);
  EXPECT_NE(ic, ib);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_get_id(c, nullptr));
}

// cuStreamGetFlags reports the creation flags.
TEST_P(Conformance, StreamGetFlags) {
  const CUstream a = make_stream();
  const CUstream b = make_stream(CU_STREAM_NON_BLOCKING);
  unsigned flags = 99;
  EXPECT_CU(CUDA_SUCCESS, t().stream_get_flags(a, &flags));
  EXPECT_EQ(flags, 0u);
  EXPECT_CU(CUDA_SUCCESS, t().stream_get_flags(b, &flags));
  EXPECT_EQ(flags & CU_STREAM_NON_BLOCKING, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_get_flags(a, nullptr));
}

// Sim: the per-thread stream is per thread: holding this thread's does not hold another's, and
// the _ptsz semantics (NULL = per-thread) are the per-thread stream's.
TEST_P(Conformance, PerThreadStreamIsOnePerThread) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUcontext ctx = make_current();
  const CUevent mine = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent theirs = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(CU_STREAM_PER_THREAD);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(mine, CU_STREAM_PER_THREAD));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(mine));
  CUresult record = CUDA_ERROR_UNKNOWN;
  CUresult query = CUDA_ERROR_UNKNOWN;
  std::thread other([&] {
    t().ctx_set_current(ctx);
    record = t().event_record(theirs, CU_STREAM_PER_THREAD);
    query = t().event_query(theirs);
    t().ctx_set_current(nullptr);
  });
  other.join();
  EXPECT_CU(CUDA_SUCCESS, record);
  EXPECT_CU(CUDA_SUCCESS, query) << "another thread's per-thread stream is not held";
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().stream_query(CU_STREAM_PER_THREAD));
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(CU_STREAM_LEGACY)) << "nor is the legacy stream";
  hooks()->release_stream(CU_STREAM_PER_THREAD);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(mine));
}

// Sim: work on the legacy stream waits for the blocking streams of its context (created ones
// and per-thread streams), not for CU_STREAM_NON_BLOCKING ones.
TEST_P(Conformance, LegacyStreamWaitsForBlockingStreamsOnly) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream blocking = make_stream(0);
  const CUstream non_blocking = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent on_legacy = make_event(CU_EVENT_DISABLE_TIMING);

  hooks()->hold_stream(non_blocking);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, non_blocking));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_legacy, nullptr));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_legacy)) << "non-blocking streams are not waited for";
  hooks()->release_stream(non_blocking);

  hooks()->hold_stream(blocking);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, blocking));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_legacy, CU_STREAM_LEGACY));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(on_legacy)) << "waits for the blocking stream";
  hooks()->release_stream(blocking);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_legacy));

  hooks()->hold_stream(CU_STREAM_PER_THREAD);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, CU_STREAM_PER_THREAD));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_legacy, nullptr));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(on_legacy))
      << "the per-thread stream synchronizes with the legacy stream";
  hooks()->release_stream(CU_STREAM_PER_THREAD);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_legacy));
}

// Sim: per-thread stream work does not wait for a blocking created stream (only the legacy
// stream synchronizes with blocking streams; the per-thread stream is an ordinary blocking
// stream to the others).
TEST_P(Conformance, PerThreadStreamDoesNotWaitForBlockingStreams) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream blocking = make_stream(0);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent on_pt = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(blocking);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, blocking));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_pt, CU_STREAM_PER_THREAD));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_pt)) << "the held blocking stream is not waited for";
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e));
  hooks()->release_stream(blocking);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
}

// Sim: work on a blocking created stream waits for the legacy stream's earlier work; work on a
// CU_STREAM_NON_BLOCKING stream does not.
TEST_P(Conformance, BlockingStreamWaitsForLegacyStreamNonBlockingDoesNot) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream blocking = make_stream(0);
  const CUstream non_blocking = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent on_legacy = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent on_blocking = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent on_non_blocking = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(CU_STREAM_LEGACY);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_legacy, nullptr));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(on_legacy));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_blocking, blocking));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(on_non_blocking, non_blocking));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(on_blocking))
      << "a blocking stream waits for the held legacy stream";
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_non_blocking))
      << "a non-blocking stream does not";
  hooks()->release_stream(CU_STREAM_LEGACY);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_legacy));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(on_blocking));
}

// Sim: cuStreamSynchronize(NULL) waits for the legacy stream's own work: with none queued it
// does not wait for (or complete) held blocking streams' work.
TEST_P(Conformance, LegacyStreamSynchronizeWithoutWorkDoesNotWaitForBlockingStreams) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream blocking = make_stream(0);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(blocking);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, blocking));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(nullptr));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e))
      << "synchronizing the idle legacy stream left the blocking stream's work pending";
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().stream_query(blocking));
  hooks()->release_stream(blocking);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
}

// Handle values are recycled (rapidsai/rmm#649 saw the same value for a new stream): the sim
// hands the most recently destroyed value to the next stream or event created.
TEST_P(Conformance, HandleValuesAreRecycled) {
  CONFORMANCE_REQUIRE_SIM("the real driver recycles when it pleases");
  const CUstream a = make_stream();
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(a));
  const CUstream b = make_stream(CU_STREAM_NON_BLOCKING);
  EXPECT_EQ(a, b);
  const CUevent e = make_event();
  ASSERT_CU(CUDA_SUCCESS, destroy_event(e));
  const CUevent f = make_event();
  EXPECT_EQ(e, f);
}

// Sim: held work of a destroyed stream stays pending under a recycled handle value: releasing
// the new stream does not finish it; an event it recorded, a context synchronize, or
// release_all does.
TEST_P(Conformance, DestroyedStreamsWorkOutlivesItsHandle) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream a = make_stream();
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(a);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, a));
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(a));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e)) << "destroy does not wait";
  const CUstream b = make_stream();
  ASSERT_EQ(a, b);
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(b)) << "the new stream inherits nothing";
  hooks()->release_stream(b);
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e));
  hooks()->release_all();
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));

  hooks()->hold_stream(b);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, b));
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(b));
  EXPECT_CU(CUDA_ERROR_NOT_READY, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_synchronize());
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));

  const CUstream c = make_stream();
  hooks()->hold_stream(c);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, c));
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(c));
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
}

// Sim: using a destroyed handle is INVALID_HANDLE (the documented code for a bad stream or
// event); one whose context was reset since is CONTEXT_IS_DESTROYED (cudf#16018 saw that code
// for an event of a destroyed context). A real driver may crash instead.
TEST_P(Conformance, StaleHandlesSayWhyTheyAreStale) {
  CONFORMANCE_REQUIRE_SIM("a destroyed handle may crash a real driver");
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  CUstream s1 = nullptr;
  CUevent e1 = nullptr;
  {
    SecondContext second(t(), dev(1));
    ASSERT_CU(CUDA_SUCCESS, t().stream_create(&s1, 0));
    ASSERT_CU(CUDA_SUCCESS, t().event_create(&e1, 0));
  }  // device 1's primary context is released: reset
  make_current();
  EXPECT_CU(CUDA_ERROR_CONTEXT_IS_DESTROYED, t().stream_query(s1));
  EXPECT_CU(CUDA_ERROR_CONTEXT_IS_DESTROYED, t().event_query(e1));
  EXPECT_CU(CUDA_ERROR_CONTEXT_IS_DESTROYED, t().stream_destroy(s1));
  const CUstream s = make_stream();
  ASSERT_CU(CUDA_SUCCESS, destroy_stream(s));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().stream_get_ctx(s, nullptr));
  unsigned long long id = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().stream_get_id(s, &id));
}

// cuCtxGetDevice gives the CUdevice of cuDeviceGet; no current context is INVALID_CONTEXT.
TEST_P(Conformance, CtxGetDeviceIsTheCUdevice) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  CUdevice d = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().ctx_get_device(&d));
  make_current();
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_device(&d));
  EXPECT_EQ(d, dev(0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().ctx_get_device(nullptr));
  if (t().ctx_get_id != nullptr) {
    unsigned long long a = 0, b = 0;
    EXPECT_CU(CUDA_SUCCESS, t().ctx_get_id(nullptr, &a));
    EXPECT_CU(CUDA_SUCCESS, t().ctx_get_id(make_current(), &b));
    EXPECT_EQ(a, b);
  }
}

// Sim: CUdevice values are not ordinals, and every entry point taking a CUdevice refuses an
// ordinal (the real driver's happen to coincide; code mixing them must fail here first).
TEST_P(Conformance, CUdeviceIsNotTheOrdinal) {
  CONFORMANCE_REQUIRE_SIM("the real driver's CUdevice values are the ordinals");
  const CUdevice d0 = dev(0);
  ASSERT_NE(d0, 0);
  int v = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE,
            t().device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
  EXPECT_CU(CUDA_SUCCESS, t().device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d0));
  size_t bytes = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_total_mem(&bytes, 0));
  char name[32];
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_get_name(name, sizeof name, 0));
  CUcontext ctx = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_retain(&ctx, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_release(0));
  int can = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_can_access_peer(&can, 0, d0));
  // CUmemLocation.id is the ordinal (cuda.h: "id is a device ordinal").
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_SUCCESS, try_create(&h, gran(), device_prop(0)));
  CUmemAllocationProp bad = device_prop(0);
  bad.location.id = d0;
  CUmemGenericAllocationHandle h2 = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, try_create(&h2, gran(), bad));
}

}  // namespace
}  // namespace expanse::conformance
