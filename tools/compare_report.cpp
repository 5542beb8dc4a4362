#include "compare_report.hpp"

#include "conf/env_config.hpp"

#include <cstdio>
#include <sstream>

namespace expanse::tools {
namespace {

using Json = nlohmann::ordered_json;
using replay::CompareReport;
using replay::CompareRow;
using replay::OomExplanation;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Json oom_json(const OomExplanation& e) {
  Json j;
  j["op"] = e.op;
  j["request_bytes"] = e.request_bytes;
  j["reserved_bytes"] = e.reserved_bytes;
  j["allocated_bytes"] = e.allocated_bytes;
  j["device_free_bytes"] = e.device_free_bytes;
  j["largest_free_block_bytes"] =
      e.largest_free_block_bytes ? Json(*e.largest_free_block_bytes) : Json(nullptr);
  j["cause"] = e.fragmentation ? "fragmentation" : "exhaustion";
  return j;
}

Json row_json(const CompareRow& r, bool with_min) {
  Json j;
  j["peak_reserved_bytes"] = r.peak_reserved_bytes;
  j["ooms"] = r.ooms;
  j["first_oom_event"] = r.first_oom_op ? Json(*r.first_oom_op) : Json(nullptr);
  if (r.first_oom) j["first_oom"] = oom_json(*r.first_oom);
  if (!r.first_oom_message.empty()) j["first_oom_message"] = r.first_oom_message;
  if (with_min) {
    j["min_capacity_bytes"] = r.min_capacity_bytes ? Json(*r.min_capacity_bytes) : Json(nullptr);
  }
  j["driver_calls_total"] = r.driver_calls_total;
  j["modeled_driver_seconds"] = r.modeled_driver_seconds;
  return j;
}

std::string explain_text(const OomExplanation& e) {
  std::ostringstream o;
  o << "at operation " << e.op << ", asking for " << conf::format_size(e.request_bytes) << ": "
    << conf::format_size(e.reserved_bytes) << " reserved, " << conf::format_size(e.allocated_bytes)
    << " allocated, " << conf::format_size(e.device_free_bytes) << " free on the device";
  if (e.largest_free_block_bytes) {
    o << ", largest free block " << conf::format_size(*e.largest_free_block_bytes);
  }
  if (e.fragmentation) {
    o << ": fragmentation (the free memory would hold the request, but no single block or new "
         "segment could)";
  } else {
    o << ": exhaustion (live memory leaves no room for the request)";
  }
  return o.str();
}

}  // namespace

Json compare_json(const CompareReport& c) {
  const bool with_min = c.pytorch.min_capacity_bytes.has_value();
  Json j;
  j["capacity_bytes"] = c.capacity;
  j["torch_conf"] = c.settings.to_conf();
  j["torch_conf_source"] = c.settings_source;
  j["pytorch_recorded"] = {
      {"peak_reserved_bytes",
       c.recorded_peak_reserved_bytes ? Json(*c.recorded_peak_reserved_bytes) : Json(nullptr)},
      {"ooms", c.recorded_ooms.size()}};
  if (!c.recorded_ooms.empty()) {
    Json list = Json::array();
    for (const auto& e : c.recorded_ooms) list.push_back(oom_json(e));
    j["pytorch_recorded"]["oom_events"] = list;
  }
  j["pytorch"] = row_json(c.pytorch, with_min);
  j["pytorch_expandable"] = row_json(c.pytorch_expandable, with_min);
  j["expanse"] = row_json(c.expanse, with_min);
  const auto& a = c.agreement;
  j["pytorch_model_agreement"] = {
      {"recorded_segment_events", a.recorded_events},
      {"reproduced_segment_events", a.reproduced_events},
      {"model_segment_events", a.model_events},
      {"first_difference_event",
       a.first_difference_op ? Json(*a.first_difference_op) : Json(nullptr)},
      {"recorded_peak_reserved_bytes", a.recorded_peak_reserved},
      {"model_peak_reserved_bytes", a.model_peak_reserved},
      {"peak_reserved_error", a.peak_error()},
      {"from_recorded_state", a.from_recorded_state},
      {"inferred_empty_cache_calls", c.inferred.empty_cache_calls},
      {"inferred_free_and_retries", c.inferred.free_and_retries},
      {"inferred_segment_frees", c.inferred.segment_frees},
      {"caveats", a.caveats}};
  j["headline"] = replay::compare_headline(c);
  j["compare_seconds"] = c.wall_seconds;
  return j;
}

std::string compare_text(const CompareReport& c, uint64_t peak_live) {
  std::ostringstream o;
  const bool with_min = c.pytorch.min_capacity_bytes.has_value();
  o << "\nside by side on " << conf::format_size(c.capacity)
    << "; PyTorch settings: " << (c.settings.to_conf().empty() ? "defaults" : c.settings.to_conf())
    << " (from " << c.settings_source << ")\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-36s %14s %8s %6s %10s %14s %13s %10s\n", "allocator",
                "peak reserved", "x live", "OOMs", "first OOM", "min capacity", "driver calls",
                "driver s");
  o << line;
  auto x_live = [&](uint64_t v) {
    return peak_live == 0 ? std::string("-")
                          : fixed(static_cast<double>(v) / static_cast<double>(peak_live), 3);
  };
  auto row = [&](const char* name, const CompareRow& r) {
    std::snprintf(
        line, sizeof line, "%-36s %14s %8s %6llu %10s %14s %13llu %10s\n", name,
        conf::format_size(r.peak_reserved_bytes).c_str(), x_live(r.peak_reserved_bytes).c_str(),
        static_cast<unsigned long long>(r.ooms),
        r.first_oom_op ? std::to_string(*r.first_oom_op).c_str() : "-",
        with_min && r.min_capacity_bytes ? conf::format_size(*r.min_capacity_bytes).c_str() : "-",
        static_cast<unsigned long long>(r.driver_calls_total),
        fixed(r.modeled_driver_seconds, 3).c_str());
    o << line;
  };
  if (c.recorded_peak_reserved_bytes) {
    std::snprintf(
        line, sizeof line, "%-36s %14s %8s %6zu %10s %14s %13s %10s\n", "PyTorch (recorded)",
        conf::format_size(*c.recorded_peak_reserved_bytes).c_str(),
        x_live(*c.recorded_peak_reserved_bytes).c_str(), c.recorded_ooms.size(),
        c.recorded_ooms.empty() ? "-" : std::to_string(c.recorded_ooms.front().op).c_str(), "-",
        "-", "-");
    o << line;
  }
  row("PyTorch (model)", c.pytorch);
  row("PyTorch expandable_segments (model)", c.pytorch_expandable);
  row("expanse", c.expanse);
  o << replay::compare_headline(c) << "\n";

  const auto& a = c.agreement;
  if (a.recorded_peak_reserved != 0 || a.recorded_events != 0) {
    o << "PyTorch model vs the recording: " << a.reproduced_events << " of " << a.recorded_events
      << " recorded segment events reproduced (size and order; the model made " << a.model_events
      << ")";
    if (a.first_difference_op) o << ", first difference at operation " << *a.first_difference_op;
    o << "; peak reserved " << conf::format_size(a.model_peak_reserved) << " vs "
      << conf::format_size(a.recorded_peak_reserved) << " recorded ("
      << fixed(100 * a.peak_error(), 2) << " %)"
      << (a.from_recorded_state ? ", from the recorded start state" : "") << "\n";
    o << "inferred from the recording (the snapshot does not mark them): "
      << c.inferred.empty_cache_calls << " empty_cache() call(s), " << c.inferred.free_and_retries
      << " free-and-retry(s) after a failed cudaMalloc, accounting for "
      << c.inferred.segment_frees
      << " recorded segment frees; both models make them, expanse releases its cache at each "
         "empty_cache()\n";
  }
  for (const auto& cv : a.caveats) o << "  note: " << cv << "\n";
  for (const auto& e : c.recorded_ooms) o << "OOM (recorded) " << explain_text(e) << "\n";
  if (c.pytorch.first_oom)
    o << "OOM (PyTorch model) " << explain_text(*c.pytorch.first_oom) << "\n";
  if (c.pytorch_expandable.first_oom) {
    o << "OOM (expandable segments model) " << explain_text(*c.pytorch_expandable.first_oom)
      << "\n";
  }
  if (c.expanse.first_oom_op) {
    o << "OOM (expanse) at operation " << *c.expanse.first_oom_op << ": "
      << c.expanse.first_oom_message << "\n";
  }
  return o.str();
}

}  // namespace expanse::tools
