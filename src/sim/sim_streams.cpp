// The sim's streams and events: ordered work items, held streams, waits and synchronization
// (spec: shared/reference/cuda_vmm_spec.md §4).
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"
#include "sim/sim_errors.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

namespace expanse::sim {
namespace {

// ---- stream helpers -----------------------------------------------------------------------------

bool special_stream(CUstream h) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  return raw == 0 || raw == 1 || raw == 2;
}

// Resolves a stream argument; special streams need a current context (INVALID_CONTEXT) unless
// default_device is given.
CUresult stream_arg(State& s, CUstream h, int default_device, Stream** out) {
  if (special_stream(h)) {
    if (default_device < 0) default_device = detail::current_device(s);
    if (default_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  Stream* st = detail::resolve_stream(s, h, default_device);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *out = st;
  return CUDA_SUCCESS;
}

Event* event_arg(State& s, CUevent h) {
  auto it = s.events.find(reinterpret_cast<const Event*>(h));
  return it == s.events.end() ? nullptr : it->second.get();
}

// Appends a work item to st. Legacy default-stream semantics: work on the NULL stream waits for
// all blocking streams of its device, and work on a blocking stream waits for the NULL stream.
uint64_t enqueue(State& s, Stream& st, std::vector<Stream::Dep> deps) {
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
  st.pending.push_back(std::move(item));
  s.busy[&st] = st.shared_from_this();
  detail::progress(s);
  return st.next_seq - 1;
}

}  // namespace

// Drops a device's streams and events (its primary context was reset).
void detail::reset_device_context(State& s, int d) {
  detail::complete_device(s, d);
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->device == d) {
      it->second->destroyed = true;
      it = s.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    it = it->second->device == d ? s.events.erase(it) : std::next(it);
  }
  device(s, d).default_stream->held = false;
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
    st->device = d;
    st->flags = flags;
    *stream = reinterpret_cast<CUstream>(st.get());
    s.streams.emplace(st.get(), std::move(st));
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_destroy(CUstream stream) {
  return run(EntryPoint::stream_destroy, true, [&](State& s, CallSize&) {
    auto it = s.streams.find(reinterpret_cast<const Stream*>(stream));
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Returns at once; pending work still completes (the stream lives on in s.busy until then).
    it->second->destroyed = true;
    s.streams.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_synchronize(CUstream stream) {
  return run(EntryPoint::stream_synchronize, true, [&](State& s, CallSize&) {
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    detail::force_complete(s, *st, st->last_seq());
    detail::progress(s);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_query(CUstream stream) {
  return run(EntryPoint::stream_query, true, [&](State& s, CallSize&) {
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    return st->pending.empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_stream_wait_event(CUstream stream, CUevent event, unsigned int flags) {
  return run(EntryPoint::stream_wait_event, true, [&](State& s, CallSize&) {
    if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    if (!e->complete() && e->stream.get() != st) enqueue(s, *st, {{e->stream, e->seq}});
    return CUDA_SUCCESS;
  });
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
    *event = reinterpret_cast<CUevent>(e.get());
    s.events.emplace(e.get(), std::move(e));
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_destroy(CUevent event) {
  return run(EntryPoint::event_destroy, true, [&](State& s, CallSize&) {
    auto it = s.events.find(reinterpret_cast<const Event*>(event));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    s.events.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_record(CUevent event, CUstream stream) {
  return run(EntryPoint::event_record, true, [&](State& s, CallSize&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, e->device, &st);
    if (r != CUDA_SUCCESS) return r;
    if (st->device != e->device) return CUDA_ERROR_INVALID_HANDLE;  // different contexts
    const uint64_t seq = enqueue(s, *st, {});
    e->stream = st->shared_from_this();
    e->seq = seq;
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_query(CUevent event) {
  return run(EntryPoint::event_query, true, [&](State& s, CallSize&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return e->complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_event_synchronize(CUevent event) {
  return run(EntryPoint::event_synchronize, true, [&](State& s, CallSize&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (e->stream) {
      detail::force_complete(s, *e->stream, e->seq);
      detail::progress(s);
    }
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
