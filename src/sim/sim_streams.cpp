// The sim's streams and events: ordered work items, held streams, waits and synchronization,
// their contexts, per-thread default streams, recycled handle values, and what stream capture
// forbids (sim_capture.cpp has the capture calls themselves).
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

namespace expanse::sim {
namespace {

// ---- stream helpers -----------------------------------------------------------------------------

constexpr uintptr_t kHandleStep = 0x200;

bool special_stream(CUstream h) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  return raw == 0 || raw == 1 || raw == 2;
}

uintptr_t take_handle(std::vector<uintptr_t>& free_list, uintptr_t& next) {
  if (!free_list.empty()) {
    const uintptr_t v = free_list.back();
    free_list.pop_back();
    return v;
  }
  const uintptr_t v = next;
  next += kHandleStep;
  return v;
}

// Resolves a stream argument; the special streams (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
// are those of the current context (INVALID_CONTEXT without one).
CUresult stream_arg(State& s, CUstream h, Stream** out) {
  int d = -1;
  if (special_stream(h)) {
    d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  Stream* st = detail::resolve_stream(s, h, d);
  if (st == nullptr) return detail::dead_stream_code(s, h);
  *out = st;
  return CUDA_SUCCESS;
}

// An entry point about one stream: the stream is resolved first, then the caller's answer
// pointers are checked (answers_given: none of them null), then body(s, stream) runs.
template <class Body>
CUresult on_stream(EntryPoint e, CUstream stream, bool answers_given, Body&& body) {
  return run(e, true, [&](State& s, CallSize&) {
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, &st);
    if (r != CUDA_SUCCESS) return r;
    if (!answers_given) return CUDA_ERROR_INVALID_VALUE;
    return body(s, *st);
  });
}

// Resolves an event argument (nullptr: *code says why).
Event* event_arg(State& s, CUevent h, CUresult* code) {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  auto it = s.events.find(raw);
  if (it != s.events.end()) return it->second.get();
  auto dead = s.dead_events.find(raw);
  *code = dead != s.dead_events.end() ? dead->second : CUDA_ERROR_INVALID_HANDLE;
  return nullptr;
}

// Resolves an event argument, then a stream argument.
CUresult event_and_stream_args(State& s, CUevent event, CUstream stream, Event** e, Stream** st) {
  CUresult code = CUDA_SUCCESS;
  *e = event_arg(s, event, &code);
  if (*e == nullptr) return code;
  return stream_arg(s, stream, st);
}

// Work for a stream: queued as a work item, or captured when the stream is capturing. The
// legacy stream may not take work while a blocking stream of its context captures (the work
// would depend on the capture): that invalidates the capture. Legacy default-stream semantics:
// work on the legacy stream waits for all blocking streams of its context (per-thread streams
// included), and work on a blocking stream waits for the legacy stream.
struct Submitted {
  uint64_t seq = 0;                   // the work item (0 when captured)
  std::shared_ptr<Capture> captured;  // the capture it went into
};

CUresult submit(State& s, Stream& st, std::vector<Stream::Dep> deps, Submitted* out,
                Stream::Effect effect = {}, uintptr_t host_lo = 0, uintptr_t host_hi = 0) {
  if (st.is_default && detail::blocking_capture_in(s, st.device)) {
    detail::invalidate_blocking_captures(s, st.device);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (st.capture) {
    if (st.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    out->captured = st.capture;
    return CUDA_SUCCESS;
  }
  if (st.is_default) {
    for (auto& [key, other] : s.busy) {
      if (other->device == st.device && !other->is_default &&
          (other->flags & CU_STREAM_NON_BLOCKING) == 0 && !other->pending.empty()) {
        deps.push_back({other, other->last_seq()});
      }
    }
  } else if ((st.flags & CU_STREAM_NON_BLOCKING) == 0) {
    auto& def = device(s, st.device).default_stream;
    if (!def->pending.empty()) deps.push_back({def, def->last_seq()});
  }
  Stream::Item item;
  item.seq = st.next_seq++;
  item.deps = std::move(deps);
  item.effect = std::move(effect);
  item.host_lo = host_lo;
  item.host_hi = host_hi;
  item.due = s.host_clock + s.cfg.gpu_lag;
  st.pending.push_back(std::move(item));
  s.busy[&st] = st.shared_from_this();
  detail::progress(s);
  out->seq = st.next_seq - 1;
  return CUDA_SUCCESS;
}

// Querying or waiting for a stream from the host. A capturing stream cannot be (its work is
// not scheduled): UNSUPPORTED, and the capture is invalidated. The legacy stream cannot be
// while a blocking stream of its context captures (IMPLICIT, invalidating it). Otherwise the
// call is "potentially unsafe" during another capture (check_unsafe_call).
CUresult host_wait_check(State& s, Stream& st) {
  if (st.capture) {
    detail::invalidate(*st.capture);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (st.is_default && detail::blocking_capture_in(s, st.device)) {
    detail::invalidate_blocking_captures(s, st.device);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  return detail::check_unsafe_call(s);
}

// An event last recorded inside a capture sequence has no work to wait for: querying or
// waiting for it is CUDA_ERROR_CAPTURED_EVENT (and invalidates the capture while it is under
// way) until it is recorded again outside capture.
CUresult captured_event_check(Event& e) {
  if (!e.captured) return CUDA_SUCCESS;
  detail::invalidate(*e.captured);
  return CUDA_ERROR_CAPTURED_EVENT;
}

}  // namespace

// Drops a device's streams and events (its primary context was reset).
void detail::reset_device_context(State& s, int d) {
  detail::forget_stream_ids();  // its streams, and the context itself for NULL / PER_THREAD
  detail::drop_captures(s, d);
  detail::complete_device(s, d);
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->device == d) {
      it->second->destroyed = true;
      s.free_stream_handles.push_back(it->first);
      s.dead_streams[it->first] = CUDA_ERROR_CONTEXT_IS_DESTROYED;
      it = s.streams.erase(it);
      detail::forget_stream_ids();
    } else {
      ++it;
    }
  }
  for (auto it = s.per_thread_streams.begin(); it != s.per_thread_streams.end();) {
    it = it->first.second == d ? s.per_thread_streams.erase(it) : std::next(it);
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    if (it->second->device == d) {
      s.free_event_handles.push_back(it->first);
      s.dead_events[it->first] = CUDA_ERROR_CONTEXT_IS_DESTROYED;
      it = s.events.erase(it);
    } else {
      ++it;
    }
  }
  device(s, d).default_stream->held = false;
  device(s, d).ctx.id = s.next_ctx_id++;
}

// ---- streams and events -------------------------------------------------------------------------

CUresult sim_stream_create(CUstream* stream, unsigned int flags) {
  return run(EntryPoint::stream_create, true, [&](State& s, CallSize&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (stream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto st = std::make_shared<Stream>();
    const uintptr_t h = take_handle(s.free_stream_handles, s.next_stream_handle);
    s.dead_streams.erase(h);
    st->handle = reinterpret_cast<CUstream>(h);
    st->id = s.next_stream_id++;
    st->device = d;
    st->flags = flags;
    *stream = st->handle;
    s.streams.emplace(h, std::move(st));
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_destroy(CUstream stream) {
  return run(EntryPoint::stream_destroy, true, [&](State& s, CallSize&) {
    auto it = s.streams.find(reinterpret_cast<uintptr_t>(stream));
    if (it == s.streams.end()) return detail::dead_stream_code(s, stream);
    // Returns at once; pending work still completes (the stream lives on in s.busy until then),
    // and the handle value is free for the next cuStreamCreate.
    Stream& st = *it->second;
    if (st.capture) detail::invalidate(*st.capture);
    st.destroyed = true;
    s.free_stream_handles.push_back(it->first);
    s.dead_streams[it->first] = CUDA_ERROR_INVALID_HANDLE;
    s.streams.erase(it);
    detail::forget_stream_ids();  // before the handle can be handed out again
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_synchronize(CUstream stream) {
  return on_stream(EntryPoint::stream_synchronize, stream, true, [&](State& s, Stream& st) {
    if (const CUresult r = host_wait_check(s, st); r != CUDA_SUCCESS) return r;
    detail::force_complete(s, st, st.last_seq());
    detail::progress(s);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_query(CUstream stream) {
  return on_stream(EntryPoint::stream_query, stream, true, [&](State& s, Stream& st) {
    if (const CUresult r = host_wait_check(s, st); r != CUDA_SUCCESS) return r;
    return st.pending.empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_stream_wait_event(CUstream stream, CUevent event, unsigned int flags) {
  return run(EntryPoint::stream_wait_event, true, [&](State& s, CallSize&) {
    if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Event* e = nullptr;
    Stream* st = nullptr;
    const CUresult r = event_and_stream_args(s, event, stream, &e, &st);
    if (r != CUDA_SUCCESS) return r;
    return detail::wait_event(s, *st, *e, flags);
  });
}

CUresult detail::wait_event(State& s, Stream& st, Event& e, unsigned flags) {
  if (st.capture && st.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (e.captured) {
    Capture& c = *e.captured;
    if (c.ended) return CUDA_ERROR_CAPTURED_EVENT;
    if (st.capture.get() == &c) {  // a join within the capture
      detail::capture_join(st, e);
      return CUDA_SUCCESS;
    }
    if (st.capture) {                                 // two captures would merge
      detail::invalidate(*st.capture);
      detail::invalidate(c);
      return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (st.is_default || st.device != c.device) {
      detail::invalidate(c);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    // A fork: the stream joins the capture sequence.
    detail::capture_membership_changed();
    st.capture = e.captured;
    c.members.push_back(st.shared_from_this());
    st.capture_nodes = 0;
    st.capture_reach.clear();
    detail::capture_join(st, e);
    return CUDA_SUCCESS;
  }
  if (st.capture) {
    if (st.capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    // A capture may only depend on work outside it through an external event wait node.
    if ((flags & CU_EVENT_WAIT_EXTERNAL) == 0 && e.stream) {
      detail::invalidate(*st.capture);
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    // An external event wait is a node of the graph (an event wait node); a plain wait on an
    // event never recorded adds nothing.
    if ((flags & CU_EVENT_WAIT_EXTERNAL) != 0) detail::capture_node(st);
    return CUDA_SUCCESS;
  }
  Submitted sub;
  std::vector<Stream::Dep> deps;
  if (!e.complete() && e.stream.get() != &st) deps.push_back({e.stream, e.seq});
  if (deps.empty() && !st.is_default) return CUDA_SUCCESS;
  return submit(s, st, std::move(deps), &sub);
}

CUresult sim_event_create(CUevent* event, unsigned int flags) {
  return run(EntryPoint::event_create, true, [&](State& s, CallSize&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (event == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto e = std::make_unique<Event>();
    e->device = d;
    e->flags = flags;
    const uintptr_t h = take_handle(s.free_event_handles, s.next_event_handle);
    s.dead_events.erase(h);
    *event = reinterpret_cast<CUevent>(h);
    s.events.emplace(h, std::move(e));
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_destroy(CUevent event) {
  return run(EntryPoint::event_destroy, true, [&](State& s, CallSize&) {
    auto it = s.events.find(reinterpret_cast<uintptr_t>(event));
    if (it == s.events.end()) {
      CUresult code = CUDA_ERROR_INVALID_HANDLE;
      event_arg(s, event, &code);
      return code;
    }
    s.free_event_handles.push_back(it->first);
    s.dead_events[it->first] = CUDA_ERROR_INVALID_HANDLE;
    s.events.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_record(CUevent event, CUstream stream) {
  return run(EntryPoint::event_record, true, [&](State& s, CallSize&) {
    Event* e = nullptr;
    Stream* st = nullptr;
    const CUresult r = event_and_stream_args(s, event, stream, &e, &st);
    if (r != CUDA_SUCCESS) return r;
    if (st->device != e->device) return CUDA_ERROR_INVALID_HANDLE;  // different contexts
    return detail::record_event(s, *st, *e);
  });
}

CUresult detail::work_stream_arg(State& s, CUstream h, Stream** out) {
  return stream_arg(s, h, out);
}

CUresult detail::submit_work(State& s, Stream& st, Stream::Effect effect, uintptr_t host_lo,
                             uintptr_t host_hi, uint64_t* seq, bool* captured) {
  Submitted sub;
  const CUresult r = submit(s, st, {}, &sub, std::move(effect), host_lo, host_hi);
  if (r != CUDA_SUCCESS) return r;
  *seq = sub.seq;
  *captured = sub.captured != nullptr;
  if (*captured) detail::capture_node(st);  // a memcpy / memset node of the graph
  return CUDA_SUCCESS;
}

CUresult detail::record_event(State& s, Stream& st, Event& e) {
  Submitted sub;
  const CUresult r = submit(s, st, {}, &sub);
  if (r != CUDA_SUCCESS) return r;
  if (sub.captured) {
    e.captured = sub.captured;
    e.stream.reset();
    e.seq = 0;
    detail::capture_record(e, st);
  } else {
    e.captured.reset();
    e.captured_reach.clear();
    e.stream = st.shared_from_this();
    e.seq = sub.seq;
  }
  return CUDA_SUCCESS;
}

namespace {

// A host wait on an event (query, synchronize): the event is resolved, must not be a captured
// one, and the call must be safe in the capture modes in force; then body(s, event) runs.
template <class Body>
CUresult host_wait_on_event(EntryPoint ep, CUevent event, Body&& body) {
  return run(ep, true, [&](State& s, CallSize&) {
    CUresult code = CUDA_SUCCESS;
    Event* e = event_arg(s, event, &code);
    if (e == nullptr) return code;
    CUresult r = captured_event_check(*e);
    if (r != CUDA_SUCCESS) return r;
    r = detail::check_unsafe_call(s);
    if (r != CUDA_SUCCESS) return r;
    return body(s, *e);
  });
}

}  // namespace

CUresult sim_event_query(CUevent event) {
  return host_wait_on_event(EntryPoint::event_query, event, [&](State&, Event& e) {
    return e.complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_event_synchronize(CUevent event) {
  return host_wait_on_event(EntryPoint::event_synchronize, event, [&](State& s, Event& e) {
    if (e.stream) {
      detail::force_complete(s, *e.stream, e.seq);
      detail::progress(s);
    }
    return CUDA_SUCCESS;
  });
}

// ---- stream properties --------------------------------------------------------------------------

CUresult sim_stream_get_ctx(CUstream stream, CUcontext* ctx) {
  return on_stream(EntryPoint::stream_get_ctx, stream, ctx != nullptr, [&](State& s, Stream& st) {
    *ctx = reinterpret_cast<CUcontext>(&device(s, st.device).ctx);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_get_ctx_v2(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  const bool given = ctx != nullptr && green != nullptr;
  return on_stream(EntryPoint::stream_get_ctx, stream, given, [&](State& s, Stream& st) {
    *ctx = reinterpret_cast<CUcontext>(&device(s, st.device).ctx);
    *green = nullptr;  // the sim has no green contexts
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_get_id(CUstream stream, unsigned long long* id) {
  if (detail::fast_stream_id(stream, id)) return CUDA_SUCCESS;  // sim_fast_path.cpp
  return on_stream(EntryPoint::stream_get_id, stream, id != nullptr, [&](State&, Stream& st) {
    if (st.capture != nullptr) {
      // Measured (H100, driver 580.159.04, torch.cuda.graph in every capture_error_mode):
      // cuStreamGetId of a capturing stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the
      // capture is invalidated. cuStreamIsCapturing / GetCaptureInfo are the legal questions.
      detail::invalidate(*st.capture);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    *id = st.id;
    detail::remember_stream_id(stream, st.id);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_get_flags(CUstream stream, unsigned int* flags) {
  const bool given = flags != nullptr;
  return on_stream(EntryPoint::stream_get_flags, stream, given, [&](State&, Stream& st) {
    *flags = st.flags;
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_get_device(CUstream stream, CUdevice* dev) {
  return on_stream(EntryPoint::stream_get_device, stream, dev != nullptr, [&](State&, Stream& st) {
    *dev = detail::device_handle(st.device);
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
