#include "models/torch_model_run.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

namespace expanse::replay {
namespace {

using Kind = TorchSegmentEvent::Kind;

std::optional<Kind> kind_of(const std::string& action) {
  if (action == "segment_alloc") return Kind::segment_alloc;
  if (action == "segment_free") return Kind::segment_free;
  if (action == "segment_map") return Kind::segment_map;
  if (action == "segment_unmap") return Kind::segment_unmap;
  return std::nullopt;
}

// Matches between two short sequences, in order (longest common subsequence).
uint64_t common_in_order(const std::vector<std::pair<Kind, uint64_t>>& a,
                         const std::vector<std::pair<Kind, uint64_t>>& b) {
  std::vector<uint64_t> row(b.size() + 1, 0), prev(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      row[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], row[j - 1]);
    }
    std::swap(row, prev);
  }
  return prev[b.size()];
}

}  // namespace

std::optional<TorchStartState> torch_start_state(const trace::Trace& t,
                                                 const trace::TorchSettings& s, std::string* why) {
  auto fail = [why](const std::string& w) -> std::optional<TorchStartState> {
    if (why != nullptr) *why = w;
    return std::nullopt;
  };
  if (!t.torch) return fail("the trace is not a PyTorch snapshot");
  const trace::TorchRecording& rec = *t.torch;
  std::map<uint64_t, TorchStartState::Segment> segs;
  for (const auto& seg : rec.end_segments) {
    if (seg.expandable) return fail("the recording used expandable segments");
    if (seg.private_pool) return fail("the recording has CUDA graph pool segments");
    if (seg.addr == 0) return fail("the snapshot's segments have no addresses (PyTorch < 2.1)");
    segs[seg.addr] = {seg.addr, seg.size, seg.stream, seg.small, {}};
  }
  // Walk the recorded segment events backwards from the end state.
  for (auto it = rec.events.rbegin(); it != rec.events.rend(); ++it) {
    if (it->action == "segment_alloc") {
      segs.erase(it->addr);
    } else if (it->action == "segment_free") {
      segs[it->addr] = {it->addr, it->size, it->stream, it->size == trace::kSmallBuffer, {}};
    } else {
      return fail("the recording used expandable segments (" + it->action + ")");
    }
  }
  for (const auto& p : rec.preexisting) {
    auto it = segs.upper_bound(p.addr);
    if (it == segs.begin()) return fail("a block allocated before recording lies in no segment");
    --it;
    auto& seg = it->second;
    const uint64_t extent = p.live_at_end ? p.size : trace::torch_round_size(s, p.size);
    if (p.addr + extent > seg.addr + seg.size) {
      return fail("a block allocated before recording runs past its segment's end");
    }
    seg.live.push_back({p.block, p.addr, extent});
  }
  TorchStartState st;
  for (auto& [addr, seg] : segs) {
    std::sort(seg.live.begin(), seg.live.end(),
              [](const auto& a, const auto& b) { return a.addr < b.addr; });
    for (size_t i = 1; i < seg.live.size(); ++i) {
      if (seg.live[i - 1].addr + seg.live[i - 1].size > seg.live[i].addr) {
        return fail("blocks allocated before recording overlap");
      }
    }
    st.reserved += seg.size;
    st.segments.push_back(std::move(seg));
  }
  return st;
}

TorchRun run_torch_model(const trace::Trace& t, const trace::TorchSettings& s,
                         const TorchRunOptions& o) {
  TorchRun r;
  r.capacity = o.capacity;
  TorchCachingModel m(s, o.capacity);
  m.record_events(o.record_events || o.recorded_addresses);

  // Recorded cudaMalloc addresses by size, handed out in order while not in use by the model.
  std::unordered_map<uint64_t, std::deque<uint64_t>> recorded;
  std::set<uint64_t> in_use;
  size_t seen_events = 0;
  // Addresses the model's cudaFree gave back may be handed out again (as the real cudaMalloc
  // does after a free-and-retry).
  auto note_freed = [&] {
    const auto& ev = m.segment_events();
    for (; seen_events < ev.size(); ++seen_events) {
      if (ev[seen_events].kind == Kind::segment_free) in_use.erase(ev[seen_events].addr);
    }
  };
  if (o.recorded_addresses && t.torch) {
    for (const auto& e : t.torch->events) {
      if (e.action == "segment_alloc") recorded[e.size].push_back(e.addr);
    }
    m.set_address_source([&](uint64_t size) -> std::optional<uint64_t> {
      note_freed();
      auto it = recorded.find(size);
      while (it != recorded.end() && !it->second.empty()) {
        const uint64_t a = it->second.front();
        it->second.pop_front();
        if (in_use.insert(a).second) return a;
      }
      return std::nullopt;
    });
  }

  uint64_t first_op = 0;
  if (o.start != nullptr) {
    // Segments holding live blocks first; wholly free ones only where they fit, since on a
    // smaller device PyTorch would have released them (release-and-retry) before failing.
    for (bool with_live : {true, false}) {
      for (const auto& seg : o.start->segments) {
        if (seg.live.empty() == with_live) continue;
        if (!m.add_segment(seg.addr, seg.size, seg.stream, seg.small, seg.live)) {
          if (!with_live) continue;
          r.start_failed = true;
          r.ooms = 1;
          r.peak_reserved = m.peak_reserved();
          return r;
        }
        in_use.insert(seg.addr);
      }
    }
    first_op = t.preexisting;  // those blocks are in the start state
  }
  // The inferred releases, in op order, made before the operation they precede.
  size_t next_release = 0;
  auto releases_before = [&](uint64_t i) {
    if (!o.inferred_releases) return;
    for (; next_release < t.releases.size() && t.releases[next_release].op <= i; ++next_release) {
      const trace::TraceRelease& rel = t.releases[next_release];
      if (rel.op < first_op) continue;
      if (rel.kind == trace::TraceRelease::Kind::empty_cache) {
        m.empty_cache();
      } else if (rel.before_oom) {
        m.release_for_failed_malloc(rel.oom_request, rel.oom_stream);
      } else {
        // ops[i]'s malloc releases what the recording did, if it needs new memory at all.
        m.refuse_next_device_allocation(rel.bytes);
      }
    }
  };
  size_t next_mark = 0;
  for (uint64_t i = 0; i < t.ops.size(); ++i) {
    const trace::TraceOp& op = t.ops[i];
    m.set_op(i);
    releases_before(i);
    if (i >= first_op) {
      if (op.type == trace::TraceOp::Type::alloc) {
        if (!m.malloc(op.block, op.size, t.streams[op.stream]) && o.stop_at_first_oom) break;
      } else {
        m.free(op.block);
      }
    }
    if (o.recorded_addresses) note_freed();
    r.ops_done = i + 1;
    if (o.record_reserved) r.reserved_after_op.push_back(m.reserved());
    if (next_mark < o.marks.size() && o.marks[next_mark] == i) {
      r.marks.push_back({i, m.driver_calls().total(), m.driver_calls().seconds(), m.reserved(),
                         m.peak_reserved(), m.driver_calls().by_name()});
      ++next_mark;
    }
  }
  if (r.ops_done == t.ops.size()) {  // releases recorded after the last operation
    m.set_op(t.ops.size());
    releases_before(t.ops.size());
  }
  r.peak_reserved = m.peak_reserved();
  r.ooms = m.oom_count();
  r.first_oom = m.first_oom();
  r.driver_calls_total = m.driver_calls().total();
  r.modeled_driver_seconds = m.driver_calls().seconds();
  r.driver_calls = m.driver_calls().by_name();
  if (o.record_events) r.segment_events = m.segment_events();
  return r;
}

double TorchAgreement::peak_error() const noexcept {
  if (recorded_peak_reserved == 0) return model_peak_reserved == 0 ? 0 : 1;
  return std::fabs(static_cast<double>(model_peak_reserved) -
                   static_cast<double>(recorded_peak_reserved)) /
         static_cast<double>(recorded_peak_reserved);
}

TorchAgreement check_torch_model(const trace::Trace& t, const trace::TorchSettings& s) {
  TorchAgreement a;
  if (!t.torch) {
    a.caveats.push_back("not a PyTorch snapshot: nothing recorded to check against");
    return a;
  }
  const trace::TorchRecording& rec = *t.torch;
  a.recorded_peak_reserved = t.torch_peak_reserved_bytes.value_or(0);
  std::string why;
  std::optional<TorchStartState> start = torch_start_state(t, s, &why);
  TorchRunOptions o;
  o.start = start ? &*start : nullptr;
  o.recorded_addresses = true;
  a.from_recorded_state = start.has_value();
  if (!start) a.caveats.push_back("started from an empty device: " + why);
  if (!rec.settings) {
    a.caveats.push_back("no allocator_settings in the snapshot: PyTorch's defaults assumed" +
                        (rec.settings_error.empty() ? "" : " (" + rec.settings_error + ")"));
  }
  if (t.streams.size() > 1) {
    a.caveats.push_back(
        "several streams: blocks used on other streams (record_stream) free "
        "later than recorded, and other threads' operations interleave");
  }
  if (!rec.ooms.empty()) {
    a.caveats.push_back("the recording has " + std::to_string(rec.ooms.size()) +
                        " OOM(s): the real device's capacity and other processes' memory are "
                        "not in the snapshot");
  }
  TorchRun run = run_torch_model(t, s, o);
  a.model_peak_reserved = run.peak_reserved;

  // Compare per operation: (action, size) sequences, in order.
  std::map<uint64_t, std::vector<std::pair<Kind, uint64_t>>> want, got;
  for (const auto& e : rec.events) {
    if (auto k = kind_of(e.action)) {
      want[e.op].push_back({*k, e.size});
      ++a.recorded_events;
    }
  }
  for (const auto& e : run.segment_events) got[e.op].push_back({e.kind, e.size});
  a.model_events = run.segment_events.size();
  std::set<uint64_t> ops;
  for (const auto& [op, v] : want) ops.insert(op);
  for (const auto& [op, v] : got) ops.insert(op);
  static const std::vector<std::pair<Kind, uint64_t>> none;
  for (uint64_t op : ops) {
    auto w = want.find(op);
    auto g = got.find(op);
    const auto& wv = w == want.end() ? none : w->second;
    const auto& gv = g == got.end() ? none : g->second;
    a.reproduced_events += common_in_order(wv, gv);
    if (wv != gv && !a.first_difference_op) a.first_difference_op = op;
  }
  if (a.reproduced_events < a.recorded_events) {
    bool frees = false;
    for (const auto& e : rec.events) frees = frees || e.action == "segment_free";
    if (frees) {
      a.caveats.push_back(
          "recorded segment_free events come from torch.cuda.empty_cache() or a cudaMalloc "
          "that failed on the real device, which the snapshot does not mark: the releases "
          "inferred from the recording did not account for all of them");
    }
  }
  return a;
}

TorchMinCapacity torch_min_capacity(const trace::Trace& t, const trace::TorchSettings& s,
                                    const TorchRunOptions& base, uint64_t unconstrained_peak) {
  constexpr uint64_t g = trace::kSmallBuffer;
  TorchMinCapacity out;
  auto fits = [&](uint64_t units) {
    ++out.probes;
    TorchRunOptions o = base;
    o.capacity = units * g;
    o.stop_at_first_oom = true;
    o.record_events = false;
    o.record_reserved = false;
    return run_torch_model(t, s, o).ooms == 0;
  };
  // lo: too small (below the peak of live bytes); hi: fits (the unconstrained peak never fails).
  uint64_t lo = (t.peak_live_bytes + g - 1) / g;
  lo = lo == 0 ? 0 : lo - 1;
  uint64_t hi = std::max((unconstrained_peak + g - 1) / g, lo + 1);
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  out.bytes = hi * g;
  return out;
}

}  // namespace expanse::replay
