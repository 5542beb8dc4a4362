#include "report/settling.hpp"

#include "report/driver_floor.hpp"
#include "trace/torch_settings.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace expanse::replay {

using driver::EntryPoint;

std::vector<StepCalls> steps_between_marks(const std::vector<ReplayMark>& expanse,
                                           const std::vector<TorchMark>& model) {
  std::vector<StepCalls> out;
  const size_t n = std::min(expanse.size(), model.size());
  for (size_t i = 0; i < n; ++i) {
    const ReplayMark& x = expanse[i];
    const TorchMark& m = model[i];
    StepCalls s;
    for (size_t e = 0; e < s.calls.size(); ++e) {
      s.calls[e] = x.driver_calls[e] - (i > 0 ? expanse[i - 1].driver_calls[e] : 0);
    }
    s.created_pages = x.created_pages - (i > 0 ? expanse[i - 1].created_pages : 0);
    s.peak_physical_before = i > 0 ? expanse[i - 1].peak_physical_bytes : 0;
    s.peak_physical_after = x.peak_physical_bytes;
    for (const auto& [name, count] : m.driver_calls) {
      uint64_t before = 0;
      if (i > 0) {
        const auto it = model[i - 1].driver_calls.find(name);
        if (it != model[i - 1].driver_calls.end()) before = it->second;
      }
      if (count > before) s.model_calls[name] = count - before;
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

bool is_synchronize(EntryPoint e) {
  return e == EntryPoint::stream_synchronize || e == EntryPoint::event_synchronize ||
         e == EntryPoint::ctx_synchronize;
}

}  // namespace

std::string settled_step_breaks(const StepCalls& s, uint64_t page) {
  std::string out;
  auto add = [&](const std::string& what) {
    if (!out.empty()) out += "; ";
    out += what;
  };
  auto calls = [&](EntryPoint e) { return s.calls[static_cast<size_t>(e)]; };
  for (EntryPoint e : {EntryPoint::mem_unmap, EntryPoint::mem_release}) {
    if (calls(e) != 0) add(std::to_string(calls(e)) + " " + driver::entry_point_name(e));
  }
  // Growth: pages above the earlier peak, each created, mapped and granted once.
  const uint64_t grown = s.peak_physical_after > s.peak_physical_before && page != 0
                             ? (s.peak_physical_after - s.peak_physical_before) / page
                             : 0;
  if (s.created_pages > grown) {
    add(std::to_string(s.created_pages) + " pages created, " + std::to_string(grown) +
        " above the earlier peak");
  }
  if (calls(EntryPoint::mem_map) > calls(EntryPoint::mem_create)) {
    add(std::to_string(calls(EntryPoint::mem_map)) + " cuMemMap for " +
        std::to_string(calls(EntryPoint::mem_create)) + " handles created");
  }
  if (calls(EntryPoint::mem_set_access) > calls(EntryPoint::mem_map)) {
    add(std::to_string(calls(EntryPoint::mem_set_access)) + " cuMemSetAccess for " +
        std::to_string(calls(EntryPoint::mem_map)) + " mappings");
  }
  auto model = [&](const std::string& name) {
    const auto it = s.model_calls.find(name);
    return it == s.model_calls.end() ? uint64_t{0} : it->second;
  };
  uint64_t syncs = 0;
  for (size_t i = 0; i < s.calls.size(); ++i) {
    const auto e = static_cast<EntryPoint>(i);
    if (e == EntryPoint::mem_create || e == EntryPoint::mem_map ||
        e == EntryPoint::mem_set_access || e == EntryPoint::mem_unmap ||
        e == EntryPoint::mem_release || s.calls[i] == 0) {
      continue;
    }
    if (is_synchronize(e)) {
      syncs += s.calls[i];
      continue;
    }
    const std::string name = driver::entry_point_name(e);
    if (s.calls[i] > model(name)) {
      add(std::to_string(s.calls[i]) + " " + name + " (the model: " +
          std::to_string(model(name)) + ")");
    }
  }
  const uint64_t model_syncs = model("cuStreamSynchronize");
  if (syncs > model_syncs) {
    add(std::to_string(syncs) + " synchronizations (the model: " + std::to_string(model_syncs) +
        ")");
  }
  return out;
}

double varying_driver_bound(double model_seconds, double one_page_floor_seconds) {
  return std::max(1.25 * model_seconds, one_page_floor_seconds) + 0.010;
}

double repeated_driver_bound(double model_seconds, double live_set_floor_seconds) {
  return std::max(1.25 * model_seconds, 1.25 * live_set_floor_seconds) + 0.010;
}

size_t SteppedRun::steps_breaking() const {
  size_t n = 0;
  for (const std::string& b : breaks) n += b.empty() ? 0 : 1;
  return n;
}

int64_t SteppedRun::worst_peak_excess(size_t* step) const {
  int64_t worst = INT64_MIN;
  for (size_t i = 0; i < peak.size() && i < model_peak.size(); ++i) {
    const int64_t d = static_cast<int64_t>(peak[i]) - static_cast<int64_t>(model_peak[i]);
    if (d > worst) {
      worst = d;
      if (step != nullptr) *step = i + 1;
    }
  }
  return worst == INT64_MIN ? 0 : worst;
}

double SteppedRun::created_ratio() const {
  if (peak_pages == 0) return 0;
  return static_cast<double>(expanse.stats.num_created_pages) / static_cast<double>(peak_pages);
}

SteppedRun run_steps(const trace::Trace& t, const std::vector<uint64_t>& step_ends,
                     const conf::Config& conf, uint64_t capacity, const HostModel& host,
                     size_t first_judged) {
  SteppedRun r;
  trace::TorchSettings es;
  es.expandable_segments = true;
  TorchRunOptions to;
  to.capacity = capacity;
  to.record_events = false;
  to.marks = step_ends;
  r.model = run_torch_model(t, es, to);

  ReplayOptions ro;
  ro.marks = step_ends;
  ro.host = host;
  r.expanse = replay_trace(t, conf, capacity, ro);
  r.page = r.expanse.page_size;
  r.steps = steps_between_marks(r.expanse.marks, r.model.marks);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    r.peak.push_back(r.expanse.marks[i].peak_physical_bytes);
    r.model_peak.push_back(r.model.marks[i].peak_reserved);
    r.breaks.push_back(i + 1 >= first_judged ? settled_step_breaks(r.steps[i], r.page) : "");
  }
  const driver::CostModel& costs = driver::CostModel::get_default();
  r.one_page_floor = one_page_driver_floor(t.peak_live_bytes, r.page, costs).seconds;
  r.bound = varying_driver_bound(r.model.modeled_driver_seconds, r.one_page_floor);
  r.peak_pages = r.page == 0 ? 0 : (r.expanse.stats.peak_physical_bytes + r.page - 1) / r.page;
  return r;
}

}  // namespace expanse::replay
