// Stream capture (CUDA graphs): begin / end / is-capturing / capture info, the thread's capture
// interaction mode, cuGraphDestroy, and the rules that decide which calls a capture forbids.
//
// Evidence (cuda.h 13.0 doxygen for cuStreamBeginCapture, cuStreamEndCapture,
// cuStreamIsCapturing, cuStreamGetCaptureInfo and cuThreadExchangeStreamCaptureMode; the CUDA
// Programming Guide, "Prohibited and Unhandled Operations"):
// - capture may not begin on the legacy stream; it ends on the stream that began it, from the
//   same thread unless the mode was RELAXED (else CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
// - querying or synchronizing a capturing stream, an event recorded in a capture, or the
//   context while one of its streams captures, is invalid and invalidates the capture;
// - a thread whose mode is GLOBAL or THREAD_LOCAL and that runs a capture not begun RELAXED, or
//   (GLOBAL only) while another thread runs a GLOBAL capture, may not make "potentially unsafe"
//   calls (see check_unsafe_call); a thread switched to RELAXED may.
//
// Which calls are "potentially unsafe" is not listed anywhere; the sim's choice, with evidence:
// - cuMemCreate and cuMemAddressReserve are NOT: a real driver (H100, 580) answered SUCCESS
//   during GLOBAL and THREAD_LOCAL captures, from the capturing thread and from a GLOBAL-mode
//   thread beside a GLOBAL capture, and the captures ended valid (test/gpu/RESULTS.md).
// - cuMemMap is NOT either: a real driver (H200, 580.159.04) answered SUCCESS during a GLOBAL
//   capture of the calling thread. That the capture stays valid, and other threads and modes,
//   are taken as for cuMemCreate [INF] (PyTorch maps expandable-segment pages inside captures
//   without switching to RELAXED, which agrees).
// - cuMemAddressFree, cuMemRelease, cuMemUnmap, cuMemSetAccess: not yet measured; kept
//   unsafe [INF], like cudaMalloc (the doc's example): not stream-ordered, unseen by capture
//   (NCCL and mscclpp switch their thread to RELAXED around these calls, PyTorch around
//   cudaMalloc). Stricter than the truth costs nothing here: expanse switches to RELAXED around
//   its VMM calls anyway. The conformance rule on VMM calls under a capture (capture_test.cpp)
//   asks a real driver each one and reports every answer.
// - cuEventQuery/Synchronize, cuStreamQuery/Synchronize of work outside the capture: PyTorch
//   switches to RELAXED around its allocator's cudaEventQuery during capture (pytorch#158352);
//   ROCm's HIP, which mirrors CUDA here, refuses them under another thread's GLOBAL capture
//   unless the caller is RELAXED/THREAD_LOCAL (ROCm/rocm-systems#3169).
// - cuCtxSynchronize: forbidden outright while a stream of the context captures, else unsafe.
// - cuMemcpyHtoD/DtoH: synchronous, ordered with the legacy stream (IMPLICIT while a blocking
//   stream captures; aws-ofi-nccl#1342), else unsafe.
// Not unsafe: stream/event creation and destruction, cuEventRecord and cuStreamWaitEvent (they
// are captured or stream-ordered), every query of properties (cuStreamGetCtx/Id/Flags/Device,
// cuStreamIsCapturing, cuStreamGetCaptureInfo, attributes, cuMemGetInfo, access queries).
// An unsafe call under another thread's GLOBAL capture also invalidates that capture [INF].
// Fork and join (cuStreamEndCapture docs, Programming Guide "Cross-stream Dependencies and
// Events"): a stream that waits on an event recorded in a capture joins it; every joined stream
// must be joined back into the origin stream (the origin waits on an event recorded on it, or on
// a stream that did so, after its last captured work), else cuStreamEndCapture on the origin is
// CUDA_ERROR_STREAM_CAPTURE_UNJOINED, and the capture ends with no graph. The sim's only graph
// nodes are external event waits (cuStreamWaitEvent with CU_EVENT_WAIT_EXTERNAL): event records
// and plain waits only move dependencies. A fork that captured nothing is taken as joined [INF]
// (its dependencies are already the origin's; ROCm's HIP counts it as unjoined).
// Codes not documented for these cases, chosen by precedent: beginning a capture on a capturing
// stream, or ending one on a stream that is not capturing, is CUDA_ERROR_ILLEGAL_STATE (what
// cuStreamUpdateCaptureDependencies documents for "the stream is not capturing"). Measured on a
// real driver (H100, 580): once another thread's end of a non-RELAXED capture was refused
// (WRONG_THREAD), the capture is unusable: the origin thread's end answers ILLEGAL_STATE with no
// graph, and the stream leaves capture mode. An event last
// recorded in a capture stays CUDA_ERROR_CAPTURED_EVENT for query/sync/wait even after the
// capture ended, until it is recorded again outside one.
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"

#include <algorithm>
#include <string>

namespace expanse::sim {
namespace detail {

namespace {
// Per thread, and reset with the sim (like the context stack), so that one test's mode does not
// leak into the next.
struct ThreadMode {
  uint64_t generation = 0;
  int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
};
thread_local ThreadMode t_mode;

bool valid_mode(int m) noexcept {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}
const char* mode_name(int m) noexcept {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL         ? "GLOBAL"
         : m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ? "THREAD_LOCAL"
         : m == CU_STREAM_CAPTURE_MODE_RELAXED      ? "RELAXED"
                                                    : "?";
}
// The calling thread's mode as last set (invalidate() has no State to check the generation).
int thread_capture_mode_raw() noexcept { return t_mode.mode; }
}  // namespace

int& thread_capture_mode(const State& s) noexcept {
  if (t_mode.generation != s.generation) {
    t_mode.generation = s.generation;
    t_mode.mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  }
  return t_mode.mode;
}

CUstreamCaptureStatus capture_status(const Stream& st) noexcept {
  if (!st.capture) return CU_STREAM_CAPTURE_STATUS_NONE;
  return st.capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

const char*& current_call() noexcept {
  thread_local const char* call = nullptr;
  return call;
}

void invalidate(Capture& c) noexcept {
  if (c.ended || c.invalidated) return;
  c.invalidated = true;
  try {
    const char* call = current_call();
    c.invalidated_by = std::string(call != nullptr ? call : "a sim control function") +
                       " on thread " + std::to_string(thread_token()) +
                       (thread_token() == c.thread ? " (the capturing thread)" : "") +
                       " in mode " + mode_name(thread_capture_mode_raw());
  } catch (...) {  // noexcept: the record is a diagnostic only
  }
}

bool blocking_capture_in(const State& s, int device) noexcept {
  for (const auto& c : s.captures) {
    if (c->device != device) continue;
    for (const auto& m : c->members) {
      if ((m->flags & CU_STREAM_NON_BLOCKING) == 0) return true;
    }
  }
  return false;
}

void invalidate_blocking_captures(State& s, int device) noexcept {
  for (const auto& c : s.captures) {
    if (c->device != device) continue;
    for (const auto& m : c->members) {
      if ((m->flags & CU_STREAM_NON_BLOCKING) == 0) invalidate(*c);
    }
  }
}

CUresult check_unsafe_call(State& s) noexcept {
  if (s.captures.empty()) return CUDA_SUCCESS;
  const int mode = thread_capture_mode(s);
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const uint64_t me = thread_token();
  bool forbidden = false;
  for (const auto& c : s.captures) {
    const bool mine = c->thread == me && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool theirs = mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->thread != me &&
                        c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (mine || theirs) {
      invalidate(*c);
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult context_sync_check(State& s, int device) noexcept {
  bool capturing = false;
  for (const auto& c : s.captures) {
    if (c->device == device) {
      invalidate(*c);
      capturing = true;
    }
  }
  return capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : check_unsafe_call(s);
}

namespace {

// Takes the capture out of the list and its streams out of capture mode.
void end(State& s, Capture& c) {
  c.ended = true;
  for (auto& m : c.members) {
    m->capture.reset();
    m->capture_nodes = 0;
    m->capture_reach.clear();
  }
  c.members.clear();
  s.captures.erase(std::remove_if(s.captures.begin(), s.captures.end(),
                                  [&](const std::shared_ptr<Capture>& p) { return p.get() == &c; }),
                   s.captures.end());
}

}  // namespace

void capture_join(Stream& st, const Event& e) {
  for (const auto& [member, nodes] : e.captured_reach) {
    uint64_t& mine = st.capture_reach[member];
    mine = std::max(mine, nodes);
  }
}

void capture_node(Stream& st) { st.capture_reach[&st] = ++st.capture_nodes; }

void capture_record(Event& e, const Stream& st) { e.captured_reach = st.capture_reach; }

namespace {
// A member stream whose captured nodes the origin's dependencies do not all cover.
bool unjoined(const Capture& c) {
  for (const auto& m : c.members) {
    if (m.get() == c.origin || m->capture_nodes == 0) continue;
    auto it = c.origin->capture_reach.find(m.get());
    if (it == c.origin->capture_reach.end() || it->second < m->capture_nodes) return true;
  }
  return false;
}
}  // namespace

void drop_captures(State& s, int device) noexcept {
  std::vector<std::shared_ptr<Capture>> todo;
  for (auto& c : s.captures) {
    if (device < 0 || c->device == device) todo.push_back(c);
  }
  for (auto& c : todo) {
    s.graphs.erase(reinterpret_cast<uintptr_t>(c->graph));
    end(s, *c);
  }
}

}  // namespace detail

namespace {

constexpr uintptr_t kGraphStep = 0x200;

CUresult capture_stream_arg(State& s, CUstream h, Stream** out) {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  int d = -1;
  if (raw <= 2) {
    d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  Stream* st = detail::resolve_stream(s, h, d);
  if (st == nullptr) return detail::dead_stream_code(s, h);
  *out = st;
  return CUDA_SUCCESS;
}

// What cuStreamIsCapturing / cuStreamGetCaptureInfo answer for a stream (IMPLICIT for the
// legacy stream while a blocking stream of its context captures; that capture stays valid).
CUresult query_status(State& s, CUstream h, Stream** out, CUstreamCaptureStatus* status) {
  const CUresult r = capture_stream_arg(s, h, out);
  if (r != CUDA_SUCCESS) return r;
  if ((*out)->is_default && detail::blocking_capture_in(s, (*out)->device))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = detail::capture_status(**out);
  return CUDA_SUCCESS;
}

CUresult capture_info(State& s, CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id,
                      CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
                      size_t* num_deps) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = nullptr;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = query_status(s, h, &st, &cs);
  if (r != CUDA_SUCCESS) return r;
  *status = cs;
  if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    if (id != nullptr) *id = st->capture->id;
    if (graph != nullptr) *graph = st->capture->graph;
    // The sim captures no graph nodes: the dependency set is always empty.
    if (deps != nullptr) *deps = nullptr;
    if (edges != nullptr) *edges = nullptr;
    if (num_deps != nullptr) *num_deps = 0;
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult sim_stream_begin_capture(CUstream stream, CUstreamCaptureMode mode) {
  return run(EntryPoint::stream_begin_capture, true, [&](State& s, CallSize&) {
    const int m = detail::bits(mode);
    if (!detail::valid_mode(m)) return CUDA_ERROR_INVALID_VALUE;
    Stream* st = nullptr;
    const CUresult r = capture_stream_arg(s, stream, &st);
    if (r != CUDA_SUCCESS) return r;
    if (st->is_default) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (st->capture) return CUDA_ERROR_ILLEGAL_STATE;
    auto c = std::make_shared<Capture>();
    c->id = s.next_capture_id++;
    c->mode = m;
    c->thread = detail::thread_token();
    c->device = st->device;
    c->origin = st;
    c->graph = reinterpret_cast<CUgraph>(s.next_graph_handle);
    s.next_graph_handle += kGraphStep;
    s.graphs[reinterpret_cast<uintptr_t>(c->graph)] = false;
    detail::capture_membership_changed();  // before any cached "not capturing" can be read
    c->members.push_back(st->shared_from_this());
    st->capture_nodes = 0;
    st->capture_reach.clear();
    st->capture = c;
    s.captures.push_back(std::move(c));
    return CUDA_SUCCESS;
  });
}

// The CUDA 10.0 ABI (no mode argument): a GLOBAL capture.
CUresult sim_stream_begin_capture_v1(CUstream stream) {
  return sim_stream_begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult sim_stream_end_capture(CUstream stream, CUgraph* graph) {
  return run(EntryPoint::stream_end_capture, true, [&](State& s, CallSize&) {
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Stream* st = nullptr;
    const CUresult r = capture_stream_arg(s, stream, &st);
    if (r != CUDA_SUCCESS) return r;
    if (!st->capture) return CUDA_ERROR_ILLEGAL_STATE;
    Capture& c = *st->capture;
    if (c.origin != st) {
      detail::invalidate(c);
      return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    if (c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != detail::thread_token()) {
      c.foreign_end_refused = true;
      return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    const auto key = reinterpret_cast<uintptr_t>(c.graph);
    const bool invalidated = c.invalidated;
    const bool open_fork = !invalidated && detail::unjoined(c);
    const std::shared_ptr<Capture> keep = st->capture;  // c outlives its removal from s
    detail::end(s, c);
    if (c.foreign_end_refused) {
      s.graphs.erase(key);
      *graph = nullptr;
      return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (invalidated || open_fork) {
      if (invalidated) {
        s.invalidated_captures.push_back(
            "capture " + std::to_string(c.id) + " (" + detail::mode_name(c.mode) + ", device " +
            std::to_string(c.device) + ", stream id " + std::to_string(st->id) +
            ", begun on thread " + std::to_string(c.thread) + ") was invalidated by " +
            c.invalidated_by);
        if (s.invalidated_captures.size() > 16) s.invalidated_captures.pop_front();
      }
      s.graphs.erase(key);
      *graph = nullptr;
      return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                         : CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    }
    s.graphs[key] = true;
    *graph = c.graph;
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status) {
  if (detail::fast_not_capturing(stream, status)) return CUDA_SUCCESS;  // sim_fast_path.cpp
  return run(EntryPoint::stream_is_capturing, true, [&](State& s, CallSize&) {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Stream* st = nullptr;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult r = query_status(s, stream, &st, &cs);
    if (r != CUDA_SUCCESS) return r;
    *status = cs;
    if (cs == CU_STREAM_CAPTURE_STATUS_NONE) detail::remember_not_capturing(stream);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_get_capture_info(CUstream stream, CUstreamCaptureStatus* status,
                                     cuuint64_t* id, CUgraph* graph,
                                     const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                     size_t* num_deps) {
  return run(EntryPoint::stream_get_capture_info, true, [&](State& s, CallSize&) {
    return capture_info(s, stream, status, id, graph, deps, edges, num_deps);
  });
}

CUresult sim_stream_get_capture_info_v2(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** deps, size_t* num_deps) {
  return run(EntryPoint::stream_get_capture_info, true, [&](State& s, CallSize&) {
    return capture_info(s, stream, status, id, graph, deps, nullptr, num_deps);
  });
}

CUresult sim_stream_get_capture_info_v1(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id) {
  return run(EntryPoint::stream_get_capture_info, true, [&](State& s, CallSize&) {
    return capture_info(s, stream, status, id, nullptr, nullptr, nullptr, nullptr);
  });
}

CUresult sim_thread_exchange_stream_capture_mode(CUstreamCaptureMode* mode) {
  return run(EntryPoint::thread_exchange_stream_capture_mode, true, [&](State& s, CallSize&) {
    if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int m = detail::bits(*mode);
    if (!detail::valid_mode(m)) return CUDA_ERROR_INVALID_VALUE;
    int& cur = detail::thread_capture_mode(s);
    const int old = cur;
    cur = m;
    *mode = static_cast<CUstreamCaptureMode>(old);
    return CUDA_SUCCESS;
  });
}

CUresult sim_graph_destroy(CUgraph graph) {
  return run(EntryPoint::graph_destroy, true, [&](State& s, CallSize&) {
    auto it = s.graphs.find(reinterpret_cast<uintptr_t>(graph));
    // A graph still being captured into may not be destroyed ("all operations other than
    // destroy ... are permitted on the graph while the capture sequence is in progress").
    if (it == s.graphs.end() || !it->second) return CUDA_ERROR_INVALID_VALUE;
    s.graphs.erase(it);
    return CUDA_SUCCESS;
  });
}

std::string capture_log() {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  std::string out;
  for (const std::string& line : detail::state_locked().invalidated_captures) {
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace expanse::sim
