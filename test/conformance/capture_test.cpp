// Rules for stream capture (CUDA graphs): cuda.h 13.0 on cuStreamBeginCapture / EndCapture /
// IsCapturing / GetCaptureInfo / cuThreadExchangeStreamCaptureMode, and the Programming Guide's
// "Prohibited and Unhandled Operations": an invalid operation during capture returns an error
// and invalidates the capture, whose cuStreamEndCapture then returns
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and a NULL graph.
#include "conformance.hpp"

#include <functional>
#include <thread>

namespace expanse::conformance {
namespace {

// The stream's capture status as an int; -1 when cuStreamIsCapturing fails.
int status_of(const driver::DriverTable& t, CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = t.stream_is_capturing(s, &st);
  return r == CUDA_SUCCESS ? static_cast<int>(st) : -1;
}

// Ends the capture on s and checks the code; a returned graph is destroyed.
void end_capture(const driver::DriverTable& t, CUstream s, CUresult expected) {
  CUgraph g = reinterpret_cast<CUgraph>(0x1);
  const CUresult r = t.stream_end_capture(s, &g);
  EXPECT_CU(expected, r);
  if (r == CUDA_SUCCESS && g != reinterpret_cast<CUgraph>(0x1)) {
    // Destroyed whatever was expected: a graph the driver returned is never leaked, and a
    // value it did not write is never passed to it (a real driver crashes on it).
    EXPECT_NE(g, nullptr);
    if (g != nullptr) {
      EXPECT_CU(CUDA_SUCCESS, t.graph_destroy(g));
    }
  } else if (expected == CUDA_SUCCESS) {
    ADD_FAILURE() << "no graph returned";
  } else if (expected == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
    EXPECT_EQ(g, nullptr) << "an invalidated capture returns a NULL graph";
  }
  EXPECT_EQ(status_of(t, s), CU_STREAM_CAPTURE_STATUS_NONE) << "the stream left capture mode";
}

// Begin/end on a created stream: ACTIVE in between, a graph out, a unique capture id.
TEST_P(Conformance, CaptureBeginEndReturnsGraph) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cuuint64_t id1 = 0;
  if (t().stream_get_capture_info != nullptr) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph g = nullptr;
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_capture_info(s, &st, &id1, &g, nullptr, nullptr,
                                                        nullptr));
    EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_NE(g, nullptr);
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_get_capture_info(s, nullptr, nullptr, nullptr,
                                                                    nullptr, nullptr, nullptr));
  }
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().stream_is_capturing(s, nullptr));
  end_capture(t(), s, CUDA_SUCCESS);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  if (t().stream_get_capture_info != nullptr) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id2 = 0;
    EXPECT_CU(CUDA_SUCCESS, t().stream_get_capture_info(s, &st, &id2, nullptr, nullptr, nullptr,
                                                        nullptr));
    EXPECT_NE(id1, id2) << "capture ids are unique";
  }
  end_capture(t(), s, CUDA_SUCCESS);
}

// Capture may not begin on the legacy stream, nor twice on one stream; bad modes are refused.
TEST_P(Conformance, CaptureBeginMisuse) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            t().stream_begin_capture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            t().stream_begin_capture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, call_raw(t().stream_begin_capture, s, 7));
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_NE(t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  end_capture(t(), s, CUDA_SUCCESS);
  CUgraph g = nullptr;
  EXPECT_NE(t().stream_end_capture(s, &g), CUDA_SUCCESS) << "not capturing";
}

// The per-thread default stream can be captured.
TEST_P(Conformance, CapturePerThreadStream) {
  make_current();
  ASSERT_CU(CUDA_SUCCESS,
            t().stream_begin_capture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(status_of(t(), CU_STREAM_PER_THREAD), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  end_capture(t(), CU_STREAM_PER_THREAD, CUDA_SUCCESS);
}

// Querying or synchronizing a capturing stream: UNSUPPORTED, and the capture is invalidated
// (further work on it answers INVALIDATED).
TEST_P(Conformance, CaptureQueryOrSyncOfCapturingStreamInvalidates) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().stream_query(s));
  EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, t().event_record(e, s));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().stream_synchronize(s))
      << "forbidden in relaxed mode too: it conflicts with capture itself";
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

// An event recorded in a capture has no work to wait for: querying or synchronizing it is
// CUDA_ERROR_CAPTURED_EVENT (even in relaxed mode), invalidating the capture. Work recorded into
// a capturing stream is captured, not executed.
TEST_P(Conformance, CaptureCapturedEventQueryInvalidates) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_CU(CUDA_ERROR_CAPTURED_EVENT, t().event_query(e));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, s));
  EXPECT_CU(CUDA_ERROR_CAPTURED_EVENT, t().event_synchronize(e));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

// Sim: work recorded into a capturing stream is captured, not queued: after the capture, the
// stream's only pending work is what came before it.
TEST_P(Conformance, CaptureRecordsNoWork) {
  CONFORMANCE_REQUIRE_SIM("needs held streams");
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent before = make_event(CU_EVENT_DISABLE_TIMING);
  hooks()->hold_stream(s);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(before, s));
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  const CUevent in = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(in, s));
  end_capture(t(), s, CUDA_SUCCESS);
  hooks()->release_stream(s);
  EXPECT_CU(CUDA_SUCCESS, t().event_query(before));
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(s));
}

// Synchronizing the context while one of its streams captures: UNSUPPORTED, invalidating.
TEST_P(Conformance, CaptureContextSynchronizeInvalidates) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().ctx_synchronize());
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_synchronize());
}

// The same from another thread, whatever its mode and the capture's: a THREAD_LOCAL capture
// restricts only its own thread's "potentially unsafe" calls, but a context sync covers the
// capturing stream itself (measured on NVIDIA GPUs: ROCm/rocm-systems#4508, rows 10-11;
// NVIDIA/TensorRT#2888). What makes an allocator that may sync a context on one thread unable to
// promise another thread's capture survives, unless the capture is announced to it.
TEST_P(Conformance, CaptureContextSynchronizeFromAnotherThreadInvalidatesThreadLocalCapture) {
  const CUcontext ctx = make_current();
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL}) {
    ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CUresult r = CUDA_SUCCESS;
    std::thread th([&] {
      t().ctx_set_current(ctx);
      CUstreamCaptureMode m = mode;
      t().thread_exchange_stream_capture_mode(&m);
      r = t().ctx_synchronize();
      t().ctx_set_current(nullptr);
    });
    th.join();
    EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, r) << "the other thread's mode " << mode;
    end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
}

// While a blocking stream captures, the legacy stream is unusable: asking whether it captures
// is IMPLICIT (capture left valid), putting work on it is IMPLICIT and invalidates. A
// non-blocking stream's capture leaves the legacy stream alone.
TEST_P(Conformance, CaptureLegacyStreamWhileBlockingStreamCaptures) {
  const CUstream blocking = make_stream(0);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, t().stream_is_capturing(CU_STREAM_LEGACY, &st));
  EXPECT_EQ(status_of(t(), blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, t().event_record(e, nullptr));
  end_capture(t(), blocking, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  const CUstream non_blocking = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS,
            t().stream_begin_capture(non_blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_SUCCESS, t().stream_is_capturing(CU_STREAM_LEGACY, &st));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_CU(CUDA_SUCCESS, t().event_record(e, nullptr));
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e));
  end_capture(t(), non_blocking, CUDA_SUCCESS);
}

// A stream waiting on an event recorded in a capture joins it (a fork); ending the capture on
// the joined stream instead of the origin is UNMATCHED.
TEST_P(Conformance, CaptureForkJoinsAndEndsOnlyAtOrigin) {
  const CUstream origin = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream fork = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent back = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, origin));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(fork, e, 0));
  EXPECT_EQ(status_of(t(), fork), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  if (t().stream_get_capture_info != nullptr) {
    cuuint64_t a = 0, b = 0;
    CUstreamCaptureStatus st{};
    EXPECT_CU(CUDA_SUCCESS,
              t().stream_get_capture_info(origin, &st, &a, nullptr, nullptr, nullptr, nullptr));
    EXPECT_CU(CUDA_SUCCESS,
              t().stream_get_capture_info(fork, &st, &b, nullptr, nullptr, nullptr, nullptr));
    EXPECT_EQ(a, b) << "one capture sequence";
  }
  ASSERT_CU(CUDA_SUCCESS, t().event_record(back, fork));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(origin, back, 0));  // the join
  CUgraph g = nullptr;
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, t().stream_end_capture(fork, &g));
  end_capture(t(), origin, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(status_of(t(), fork), CU_STREAM_CAPTURE_STATUS_NONE);
}

// A capturing stream may not wait on work outside the capture (only through an external event
// wait node): ISOLATION, invalidating the capture.
TEST_P(Conformance, CaptureWaitOnOutsideEventIsIsolation) {
  const CUstream outside = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, outside));
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_SUCCESS, t().stream_wait_event(s, e, CU_EVENT_WAIT_EXTERNAL));
  end_capture(t(), s, CUDA_SUCCESS);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, t().stream_wait_event(s, e, 0));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

// cuThreadExchangeStreamCaptureMode swaps the thread's mode.
TEST_P(Conformance, CaptureThreadExchangeMode) {
  make_current();
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(CUDA_SUCCESS, t().thread_exchange_stream_capture_mode(&m));
  EXPECT_EQ(m, CU_STREAM_CAPTURE_MODE_GLOBAL) << "threads start in GLOBAL mode";
  CUstreamCaptureMode back = m;
  ASSERT_CU(CUDA_SUCCESS, t().thread_exchange_stream_capture_mode(&back));
  EXPECT_EQ(back, CU_STREAM_CAPTURE_MODE_RELAXED);
}

// Sim: a NULL pointer or an unknown mode is refused. The rule with these crashed a real driver
// (H100, 580: the process died in the rule; the driver dereferences what it is given).
TEST_P(Conformance, CaptureThreadExchangeModeMisuse) {
  CONFORMANCE_REQUIRE_SIM("a NULL or bad mode pointer crashed a real driver");
  make_current();
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().thread_exchange_stream_capture_mode(nullptr));
  int bad = 9;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().thread_exchange_stream_capture_mode(reinterpret_cast<CUstreamCaptureMode*>(&bad)));
}

// cuMemCreate and cuMemAddressReserve are allowed during GLOBAL and THREAD_LOCAL captures of the
// calling thread, and the captures stay valid (measured: H100, driver 580, where the sim had
// them unsafe like cudaMalloc).
TEST_P(Conformance, CaptureVmmCreateAndReserveAreAllowed) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}) {
    SCOPED_TRACE(mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? "GLOBAL" : "THREAD_LOCAL");
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, mode));
    EXPECT_CU(CUDA_SUCCESS, try_create(&h, gran(), device_prop(0)));
    EXPECT_CU(CUDA_SUCCESS, try_reserve(&va, gran()));
    end_capture(t(), s, CUDA_SUCCESS);
    if (h != 0) {
      EXPECT_CU(CUDA_SUCCESS, release(h));
    }
    if (va != 0) {
      EXPECT_CU(CUDA_SUCCESS, address_free(va, gran()));
    }
  }
}

// Which VMM calls a GLOBAL capture of the calling thread forbids. cuMemMap does not: it succeeds
// (measured: H200, driver 580.159.04), and the capture stays valid as after cuMemCreate and
// cuMemAddressReserve [INF: the end after it is asked separately]. cuMemSetAccess, cuMemUnmap,
// cuMemRelease and cuMemAddressFree are "potentially unsafe" [INF: not yet measured on a real
// driver; like cudaMalloc, the doc's example: not stream-ordered, unseen by capture; NCCL and
// mscclpp switch to RELAXED around them]: UNSUPPORTED, invalidating the capture. A thread
// switched to RELAXED, or a capture begun RELAXED, permits them all. Every answer is recorded
// and all differences are reported at the end; the case follows what the driver did (a call that
// succeeded in a capture is not made again after it), so one GPU run answers for each call.
TEST_P(Conformance, CaptureVmmMapAllowedUnmapAccessReleaseUnsafeUnlessRelaxed) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  Answers a;
  // Ends the capture on s as `what`; a returned graph is destroyed.
  auto end = [&](const std::string& what, CUresult expected) {
    CUgraph g = nullptr;
    const CUresult r = a(what, expected, t().stream_end_capture(s, &g));
    if (r == CUDA_SUCCESS && g != nullptr) {
      EXPECT_CU(CUDA_SUCCESS, t().graph_destroy(g));
    }
    EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_NONE) << what << " left capture mode";
  };
  // One call in a GLOBAL capture of this thread, then the capture's end: INVALIDATED after a
  // refused call, SUCCESS after an allowed one. A capture that did not begin makes no call
  // (CUDA_ERROR_UNKNOWN: the caller makes it after the capture).
  auto in_global_capture = [&](const std::string& name, CUresult expected,
                               const std::function<CUresult()>& call) {
    if (a("cuStreamBeginCapture(GLOBAL) for " + name, CUDA_SUCCESS,
          t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) != CUDA_SUCCESS) {
      return CUDA_ERROR_UNKNOWN;
    }
    const CUresult r = a(name + " in a GLOBAL capture", expected, call());
    end("cuStreamEndCapture after " + name,
        expected == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    return r;
  };
  // The call made outside a capture when the capture did not make it (refused, or not begun).
  auto after_unless_done = [&](CUresult in_capture, const std::string& name,
                               const std::function<CUresult()>& call) {
    return in_capture == CUDA_SUCCESS ? CUDA_SUCCESS
                                      : a(name + " after the capture", CUDA_SUCCESS, call());
  };

  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, try_reserve(&va, gran()));
  ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), device_prop(0)));
  CUresult r =
      in_global_capture("cuMemMap", CUDA_SUCCESS, [&] { return try_map(va, gran(), 0, h); });
  if (after_unless_done(r, "cuMemMap", [&] { return try_map(va, gran(), 0, h); }) != CUDA_SUCCESS) {
    return;  // nothing mapped: the calls on the mapping have nothing to answer about
  }
  r = in_global_capture("cuMemSetAccess", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        [&] { return set_access(va, gran()); });
  after_unless_done(r, "cuMemSetAccess", [&] { return set_access(va, gran()); });
  r = in_global_capture("cuMemUnmap", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        [&] { return unmap(va, gran()); });
  after_unless_done(r, "cuMemUnmap", [&] { return unmap(va, gran()); });
  r = in_global_capture("cuMemRelease", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        [&] { return release(h); });
  after_unless_done(r, "cuMemRelease", [&] { return release(h); });
  r = in_global_capture("cuMemAddressFree", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        [&] { return address_free(va, gran()); });
  after_unless_done(r, "cuMemAddressFree", [&] { return address_free(va, gran()); });

  // Every VMM call, each made only if what it needs succeeded: in a GLOBAL capture with the
  // thread switched to RELAXED, then in a RELAXED capture.
  for (const bool thread_relaxed : {true, false}) {
    const std::string in = thread_relaxed ? " (thread RELAXED in a GLOBAL capture)"
                                          : " (in a RELAXED capture)";
    if (a("cuStreamBeginCapture" + in, CUDA_SUCCESS,
          t().stream_begin_capture(s, thread_relaxed ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                                     : CU_STREAM_CAPTURE_MODE_RELAXED)) !=
        CUDA_SUCCESS) {
      continue;
    }
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool switched =
        thread_relaxed && a("cuThreadExchangeStreamCaptureMode(RELAXED)" + in, CUDA_SUCCESS,
                            t().thread_exchange_stream_capture_mode(&m)) == CUDA_SUCCESS;
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle ph = 0;
    const bool reserved = a("cuMemAddressReserve" + in, CUDA_SUCCESS, try_reserve(&p, gran())) ==
                          CUDA_SUCCESS;
    const bool created = a("cuMemCreate" + in, CUDA_SUCCESS,
                           try_create(&ph, gran(), device_prop(0))) == CUDA_SUCCESS;
    if (reserved && created &&
        a("cuMemMap" + in, CUDA_SUCCESS, try_map(p, gran(), 0, ph)) == CUDA_SUCCESS) {
      a("cuMemSetAccess" + in, CUDA_SUCCESS, set_access(p, gran()));
      a("cuMemUnmap" + in, CUDA_SUCCESS, unmap(p, gran()));
    }
    if (created) a("cuMemRelease" + in, CUDA_SUCCESS, release(ph));
    if (reserved) a("cuMemAddressFree" + in, CUDA_SUCCESS, address_free(p, gran()));
    // The thread's mode is restored whatever happened: a real driver keeps it for later cases.
    if (switched) {
      a("cuThreadExchangeStreamCaptureMode(back)" + in, CUDA_SUCCESS,
        t().thread_exchange_stream_capture_mode(&m));
    }
    end("cuStreamEndCapture" + in, CUDA_SUCCESS);
  }
}

// Querying an unrelated event or stream is potentially unsafe too (PyTorch switches to RELAXED
// around its cudaEventQuery during capture, pytorch#158352; a watchdog thread's cudaEventQuery
// of a pre-capture event broke GLOBAL captures, pytorch#104555 / #105182 / #148594, see
// CaptureWatchdogQueryBreaksOnlyGlobalCapture).
TEST_P(Conformance, CaptureQueryOfOtherWorkIsUnsafeUnlessRelaxed) {
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream other = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, other));
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().event_query(e));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(CUDA_SUCCESS, t().thread_exchange_stream_capture_mode(&m));
  EXPECT_CU(CUDA_SUCCESS, t().event_query(e));
  EXPECT_CU(CUDA_SUCCESS, t().stream_query(other));
  EXPECT_CU(CUDA_SUCCESS, t().event_synchronize(e));
  ASSERT_CU(CUDA_SUCCESS, t().thread_exchange_stream_capture_mode(&m));
  end_capture(t(), s, CUDA_SUCCESS);
}

// Another thread's GLOBAL capture forbids unsafe calls of a thread in GLOBAL mode, not of one in
// THREAD_LOCAL or RELAXED mode; a THREAD_LOCAL capture forbids nothing to other threads. The
// unsafe call: a query of an event recorded before the capture (measured unsafe for a GLOBAL
// thread, see CaptureWatchdogQueryBreaksOnlyGlobalCapture); cuMemCreate is allowed to all
// (measured: H100, driver 580).
TEST_P(Conformance, CaptureOtherThreadsFollowTheirMode) {
  const CUcontext ctx = make_current();
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream other = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, other));
  ASSERT_CU(CUDA_SUCCESS, t().event_synchronize(e));  // a GPU may answer NOT_READY otherwise
  CUmemGenericAllocationHandle created = 0;
  auto in_thread = [&](CUstreamCaptureMode mode, bool query) {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread th([&] {
      t().ctx_set_current(ctx);
      CUstreamCaptureMode m = mode;
      t().thread_exchange_stream_capture_mode(&m);
      if (query) {
        r = t().event_query(e);
      } else {
        const CUmemAllocationProp prop = device_prop(0);
        r = t().mem_create(&created, gran(), &prop, 0);  // released after the capture
      }
      t().ctx_set_current(nullptr);
    });
    th.join();
    return r;
  };
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_SUCCESS, in_thread(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, true));
  EXPECT_CU(CUDA_SUCCESS, in_thread(CU_STREAM_CAPTURE_MODE_RELAXED, true));
  EXPECT_CU(CUDA_SUCCESS, in_thread(CU_STREAM_CAPTURE_MODE_GLOBAL, false));
  EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, in_thread(CU_STREAM_CAPTURE_MODE_GLOBAL, true));
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  if (created != 0) {
    EXPECT_CU(CUDA_SUCCESS, release(created));
  }

  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_CU(CUDA_SUCCESS, in_thread(CU_STREAM_CAPTURE_MODE_GLOBAL, true));
  end_capture(t(), s, CUDA_SUCCESS);
}

// A watchdog thread (GLOBAL mode) querying an event recorded before the capture breaks a GLOBAL
// capture (UNSUPPORTED, invalidated), and not a THREAD_LOCAL one: pytorch#104555, #105182 and
// #148594 (NCCL's watchdog cudaEventQuery during torch.cuda.graph capture; PyTorch then captures
// in THREAD_LOCAL mode), and #158352.
TEST_P(Conformance, CaptureWatchdogQueryBreaksOnlyGlobalCapture) {
  const CUcontext ctx = make_current();
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream other = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(e, other));
  ASSERT_CU(CUDA_SUCCESS, t().event_synchronize(e));  // a GPU may answer NOT_READY otherwise
  auto watchdog_query = [&] {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread th([&] {
      t().ctx_set_current(ctx);
      r = t().event_query(e);
      t().ctx_set_current(nullptr);
    });
    th.join();
    return r;
  };
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, watchdog_query());
  EXPECT_EQ(status_of(t(), s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  end_capture(t(), s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_CU(CUDA_SUCCESS, watchdog_query());
  end_capture(t(), s, CUDA_SUCCESS);
}

// cuStreamEndCapture on the origin while a forked stream has captured work not joined back is
// CUDA_ERROR_STREAM_CAPTURE_UNJOINED (cuda.h: cuStreamEndCapture; Programming Guide, "Cross-stream
// Dependencies and Events": other streams "must also be joined back to the origin stream");
// the capture ends, every stream leaves capture mode. The work: an external event wait node.
// Joined back, directly or through another forked stream, the capture succeeds.
TEST_P(Conformance, CaptureUnjoinedForkFailsEndCapture) {
  const CUstream origin = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream fork = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream fork2 = make_stream(CU_STREAM_NON_BLOCKING);
  const CUstream outside = make_stream(CU_STREAM_NON_BLOCKING);
  const CUevent ext = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent e = make_event(CU_EVENT_DISABLE_TIMING);
  const CUevent back = make_event(CU_EVENT_DISABLE_TIMING);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(ext, outside));
  auto fork_with_work = [&](CUstream f) {
    ASSERT_CU(CUDA_SUCCESS, t().event_record(e, origin));
    ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(f, e, 0));
    ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(f, ext, CU_EVENT_WAIT_EXTERNAL));
  };
  // Never joined.
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fork_with_work(fork);
  CUgraph g = reinterpret_cast<CUgraph>(0x1);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, t().stream_end_capture(origin, &g));
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(status_of(t(), origin), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(status_of(t(), fork), CU_STREAM_CAPTURE_STATUS_NONE);
  // Joined, then more work on the fork: unjoined again.
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fork_with_work(fork);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(back, fork));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(origin, back, 0));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(fork, ext, CU_EVENT_WAIT_EXTERNAL));
  g = reinterpret_cast<CUgraph>(0x1);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, t().stream_end_capture(origin, &g));
  EXPECT_EQ(g, nullptr);
  // Joined after its last work: a graph.
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fork_with_work(fork);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(back, fork));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(origin, back, 0));
  end_capture(t(), origin, CUDA_SUCCESS);
  EXPECT_EQ(status_of(t(), fork), CU_STREAM_CAPTURE_STATUS_NONE);
  // Joined transitively: fork2 joins fork, fork joins the origin.
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fork_with_work(fork);
  fork_with_work(fork2);
  ASSERT_CU(CUDA_SUCCESS, t().event_record(back, fork2));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(fork, back, 0));
  ASSERT_CU(CUDA_SUCCESS, t().event_record(back, fork));
  ASSERT_CU(CUDA_SUCCESS, t().stream_wait_event(origin, back, 0));
  end_capture(t(), origin, CUDA_SUCCESS);
  // An invalidated capture answers INVALIDATED before UNJOINED.
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fork_with_work(fork);
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, t().stream_query(origin));
  end_capture(t(), origin, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(status_of(t(), fork), CU_STREAM_CAPTURE_STATUS_NONE);
}

// A capture not begun RELAXED must end on the thread that began it (WRONG_THREAD otherwise).
TEST_P(Conformance, CaptureEndsOnItsThreadUnlessRelaxed) {
  const CUcontext ctx = make_current();
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  auto end_in_thread = [&](CUgraph* g) {
    CUresult r = CUDA_ERROR_UNKNOWN;
    std::thread th([&] {
      t().ctx_set_current(ctx);
      r = t().stream_end_capture(s, g);
      t().ctx_set_current(nullptr);
    });
    th.join();
    return r;
  };
  CUgraph g = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, end_in_thread(&g));
  // The refused end leaves the capture unusable: the origin's own end is ILLEGAL_STATE, no
  // graph, and the stream is out of capture mode (measured: H100, driver 580).
  end_capture(t(), s, CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  end_capture(t(), s, CUDA_SUCCESS);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU(CUDA_SUCCESS, end_in_thread(&g));
  EXPECT_CU(CUDA_SUCCESS, t().graph_destroy(g));
}

// Sim: a graph is destroyed once; one still being captured into cannot be.
TEST_P(Conformance, CaptureGraphDestroyMisuse) {
  CONFORMANCE_REQUIRE_SIM("destroying a graph twice is undefined on a real driver");
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUstreamCaptureStatus st{};
  CUgraph live = nullptr;
  ASSERT_CU(CUDA_SUCCESS,
            t().stream_get_capture_info(s, &st, nullptr, &live, nullptr, nullptr, nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().graph_destroy(live));
  CUgraph g = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_end_capture(s, &g));
  EXPECT_EQ(g, live);
  EXPECT_CU(CUDA_SUCCESS, t().graph_destroy(g));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().graph_destroy(g));
}

}  // namespace
}  // namespace expanse::conformance
