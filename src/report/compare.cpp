#include "report/compare.hpp"

#include "conf/env_config.hpp"

#include <algorithm>
#include <chrono>

namespace expanse::replay {
namespace {

std::vector<uint64_t> live_series(const trace::Trace& t) {
  std::vector<uint64_t> size(t.blocks, 0), out;
  out.reserve(t.ops.size());
  uint64_t live = 0;
  for (const trace::TraceOp& op : t.ops) {
    if (op.type == trace::TraceOp::Type::alloc) {
      size[op.block] = op.size;
      live += op.size;
    } else {
      live -= size[op.block];
      size[op.block] = 0;
    }
    out.push_back(live);
  }
  return out;
}

// PyTorch's own reserved memory after every operation: the end state minus the recorded net
// change gives the start; each segment event applies before the operation it precedes.
std::vector<uint64_t> recorded_reserved_series(const trace::Trace& t) {
  std::vector<uint64_t> out;
  if (!t.torch) return out;
  int64_t end = 0, net = 0;
  for (const auto& s : t.torch->end_segments) end += static_cast<int64_t>(s.size);
  auto delta = [](const trace::TorchRecording::SegmentEvent& e) {
    const bool grows = e.action == "segment_alloc" || e.action == "segment_map";
    return grows ? static_cast<int64_t>(e.size) : -static_cast<int64_t>(e.size);
  };
  for (const auto& e : t.torch->events) net += delta(e);
  int64_t reserved = end - net;
  size_t next = 0;
  const auto& ev = t.torch->events;
  out.reserve(t.ops.size());
  for (uint64_t i = 0; i < t.ops.size(); ++i) {
    for (; next < ev.size() && ev[next].op <= i; ++next) reserved += delta(ev[next]);
    out.push_back(static_cast<uint64_t>(std::max<int64_t>(reserved, 0)));
  }
  return out;
}

OomExplanation explain(const TorchOom& o, uint64_t capacity) {
  OomExplanation e;
  e.op = o.op;
  e.request_bytes = o.request;
  e.reserved_bytes = o.reserved;
  e.allocated_bytes = o.allocated;
  e.device_free_bytes = capacity > o.reserved ? capacity - o.reserved : 0;
  e.largest_free_block_bytes = o.largest_free_block;
  e.fragmentation = o.fragmentation;
  return e;
}

CompareRow model_row(const TorchRun& r) {
  CompareRow row;
  row.peak_reserved_bytes = r.peak_reserved;
  row.ooms = r.ooms;
  if (r.first_oom) {
    row.first_oom_op = r.first_oom->op;
    row.first_oom = explain(*r.first_oom, r.capacity);
  } else if (r.start_failed) {
    row.first_oom_op = 0;
  }
  row.driver_calls_total = r.driver_calls_total;
  row.modeled_driver_seconds = r.modeled_driver_seconds;
  return row;
}

}  // namespace

CompareReport make_compare_report(const ReplayReport& rep, const conf::Config& conf,
                                  const CompareRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  const trace::Trace& t = rep.trace;
  CompareReport c;
  c.capacity = rep.replay.capacity;
  if (req.torch_conf) {
    c.settings = *req.torch_conf;
    c.settings_source = "--torch-conf";
  } else if (t.torch && t.torch->settings) {
    c.settings = *t.torch->settings;
    c.settings_source = "the snapshot's allocator_settings";
  } else {
    c.settings_source = "PyTorch's defaults";
  }
  c.recorded_peak_reserved_bytes = t.torch_peak_reserved_bytes;
  for (const trace::TraceRelease& rel : t.releases) {
    ++(rel.kind == trace::TraceRelease::Kind::empty_cache ? c.inferred.empty_cache_calls
                                                         : c.inferred.free_and_retries);
    c.inferred.segment_frees += rel.segment_frees;
  }

  // PyTorch, modelled: from the recorded start state when there is one. The check against the
  // recording uses the same settings (cudaMalloc'd segments, as the shared snapshots have).
  trace::TorchSettings plain = c.settings;
  plain.expandable_segments = false;
  c.agreement = check_torch_model(t, plain);
  if (req.torch_conf) {
    auto& cv = c.agreement.caveats;
    cv.erase(std::remove_if(
                 cv.begin(), cv.end(),
                 [](const std::string& n) { return n.rfind("no allocator_settings", 0) == 0; }),
             cv.end());
    cv.push_back("settings from --torch-conf, not necessarily the recording's");
  }
  std::optional<TorchStartState> start = torch_start_state(t, plain, nullptr);
  TorchRunOptions o;
  o.capacity = c.capacity;
  o.start = start ? &*start : nullptr;
  o.recorded_addresses = true;
  o.record_reserved = req.series;
  TorchRun pt = run_torch_model(t, plain, o);
  c.pytorch = model_row(pt);

  // With expandable segments: an empty device (its segments cannot be rebuilt from cudaMalloc'd
  // ones), the blocks from before recording allocated first, as for expanse.
  trace::TorchSettings exp = c.settings;
  exp.expandable_segments = true;
  TorchRunOptions oe;
  oe.capacity = c.capacity;
  oe.record_reserved = req.series;
  TorchRun ex = run_torch_model(t, exp, oe);
  c.pytorch_expandable = model_row(ex);

  if (req.min_capacity) {
    TorchRunOptions free_run = o;
    free_run.capacity = uint64_t{1} << 62;
    free_run.record_reserved = false;
    const uint64_t pt_peak = run_torch_model(t, plain, free_run).peak_reserved;
    c.pytorch.min_capacity_bytes = torch_min_capacity(t, plain, o, pt_peak).bytes;
    TorchRunOptions free_exp = oe;
    free_exp.capacity = uint64_t{1} << 62;
    free_exp.record_reserved = false;
    const uint64_t ex_peak = run_torch_model(t, exp, free_exp).peak_reserved;
    c.pytorch_expandable.min_capacity_bytes = torch_min_capacity(t, exp, oe, ex_peak).bytes;
  }

  const ReplayResult& r = rep.replay;
  c.expanse.peak_reserved_bytes = r.stats.peak_physical_bytes;
  c.expanse.ooms = r.ooms;
  if (r.ooms != 0) {
    c.expanse.first_oom_op = r.first_oom_op;
    c.expanse.first_oom_message = r.first_oom;
  }
  if (rep.min_capacity) c.expanse.min_capacity_bytes = rep.min_capacity->bytes;
  // With --repeat, the first pass: what the models are compared with.
  if (!r.passes.empty()) {
    c.expanse.peak_reserved_bytes = r.passes.front().peak_physical_bytes;
    c.expanse.driver_calls_total = r.passes.front().driver_calls_total;
    c.expanse.modeled_driver_seconds = r.passes.front().modeled_driver_seconds;
  } else {
    c.expanse.driver_calls_total = r.stats.total_driver_calls();
    c.expanse.modeled_driver_seconds = r.stats.modeled_driver_ns * 1e-9;
  }

  // The snapshot's own OOMs, explained from the recorded reserved memory and live bytes.
  std::vector<uint64_t> live = live_series(t);
  std::vector<uint64_t> recorded = recorded_reserved_series(t);
  if (t.torch) {
    for (const auto& o2 : t.torch->ooms) {
      OomExplanation e;
      e.op = o2.op;
      e.request_bytes = o2.size;
      const uint64_t before = o2.op == 0 ? 0 : o2.op - 1;
      e.allocated_bytes =
          o2.op == 0 || live.empty() ? 0 : live[std::min<uint64_t>(before, live.size() - 1)];
      e.reserved_bytes = recorded.empty() || o2.op == 0
                             ? 0
                             : recorded[std::min<uint64_t>(before, recorded.size() - 1)];
      e.device_free_bytes = o2.device_free;
      const uint64_t cached =
          e.reserved_bytes > e.allocated_bytes ? e.reserved_bytes - e.allocated_bytes : 0;
      e.fragmentation = e.device_free_bytes + cached >= e.request_bytes;
      c.recorded_ooms.push_back(e);
    }
  }

  if (req.series) {
    c.series.live = std::move(live);
    c.series.recorded_reserved = std::move(recorded);
    c.series.pytorch_reserved = std::move(pt.reserved_after_op);
    c.series.expandable_reserved = std::move(ex.reserved_after_op);
    ReplayOptions series;
    series.record_mapped = true;
    series.host = r.host;  // the report's replay, as it ran
    c.series.expanse_mapped = replay_trace(t, conf, r.capacity, series).mapped_after_op;
  }
  c.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

std::string compare_headline(const CompareReport& c) {
  const bool min = c.pytorch.min_capacity_bytes.has_value();
  auto need = [&](const CompareRow& r) {
    return conf::format_size(min && r.min_capacity_bytes ? *r.min_capacity_bytes
                                                         : r.peak_reserved_bytes);
  };
  std::string verb = min ? "needs at least " : "reserves ";
  return "PyTorch " + verb + need(c.pytorch) + " for this workload, expandable segments " +
         need(c.pytorch_expandable) + ", expanse " + need(c.expanse) +
         (min ? " (smallest devices with no OOM)"
              : " (peak reserved; --min-capacity for the smallest devices)");
}

}  // namespace expanse::replay
