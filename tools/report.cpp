#include "report.hpp"

#include "driver/driver.hpp"
#include "report/driver_floor.hpp"
#include "conf/env_config.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace expanse::tools {
namespace {

using Json = nlohmann::ordered_json;
using replay::MinCapacity;
using replay::ReplayReport;
using replay::ReplayResult;
using trace::Trace;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "51.16 GiB (54937606148 B)"
std::string bytes_text(uint64_t b) {
  return conf::format_size(b) + " (" + std::to_string(b) + " B)";
}

std::string ratio_text(uint64_t v, uint64_t live) {
  if (live == 0) return "";
  return " = " + fixed(static_cast<double>(v) / static_cast<double>(live), 3) + " x peak live";
}

// "12345 (cuMemCreate 3000, cuMemMap 3000, ...)": the busiest entry points first.
std::string calls_text(const core::DeviceStats& s, size_t top = 6) {
  std::vector<std::pair<uint64_t, int>> v;
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    if (s.driver_calls[static_cast<size_t>(i)] != 0) {
      v.emplace_back(s.driver_calls[static_cast<size_t>(i)], i);
    }
  }
  std::sort(v.begin(), v.end(), [](auto a, auto b) { return a.first > b.first; });
  std::string out = std::to_string(s.total_driver_calls()) + " calls";
  if (v.empty()) return out;
  out += " (";
  for (size_t i = 0; i < v.size() && i < top; ++i) {
    out += (i == 0 ? "" : ", ") +
           std::string(driver::entry_point_name(static_cast<driver::EntryPoint>(v[i].second))) +
           " " + std::to_string(v[i].first);
  }
  if (v.size() > top) out += ", ...";
  return out + ")";
}

}  // namespace

Json driver_calls_json(const core::DeviceStats& s) {
  Json j = Json::object();
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    j[driver::entry_point_name(static_cast<driver::EntryPoint>(i))] =
        s.driver_calls[static_cast<size_t>(i)];
  }
  return j;
}

namespace {

// The floor under the preexisting blocks, where it is a bound: only for a first pass that placed
// every one of them (one that ran out of memory on some paid nothing for those).
std::optional<replay::DriverFloor> preexisting_floor(const ReplayReport& r) {
  const ReplayResult& p = r.replay;
  if (r.trace.preexisting == 0 || p.passes.empty() || p.passes.front().ooms != 0) return {};
  return replay::preexisting_driver_floor(r.trace, p.page_size, driver::CostModel::get_default());
}

// The floor under the whole first pass (every moment's live blocks), where it is a bound: for a
// first pass with no OOM.
std::optional<replay::LiveSetFloor> live_set_floor(const ReplayReport& r) {
  const ReplayResult& p = r.replay;
  if (p.passes.empty() || p.passes.front().ooms != 0) return {};
  const replay::LiveSetFloor f =
      replay::live_set_driver_floor(r.trace, p.page_size, driver::CostModel::get_default());
  if (f.blocks == 0) return {};
  return f;
}

}  // namespace

Json replay_json(const ReplayReport& r) {
  const Trace& t = r.trace;
  const ReplayResult& p = r.replay;
  Json j;
  j["trace"] = t.path;
  j["format"] = t.format;
  if (t.format == "pytorch-snapshot") j["device"] = t.device;
  j["events"] = t.events;
  j["allocs"] = t.allocs;
  j["frees"] = t.frees;
  j["preexisting_allocs"] = t.preexisting;
  j["preexisting_bytes"] = t.preexisting_bytes;
  if (t.format == "rmm-csv") j["failed_allocs"] = t.failed_allocs;
  j["streams"] = t.streams.size();
  j["peak_live_bytes"] = t.peak_live_bytes;
  if (t.torch_peak_reserved_bytes) j["torch_peak_reserved_bytes"] = *t.torch_peak_reserved_bytes;
  j["host"] = p.host.describe();
  j["capacity_bytes"] = p.capacity;
  j["page_size_bytes"] = p.page_size;
  j["ooms"] = p.ooms;
  if (p.ooms != 0) {
    j["first_oom_op"] = p.first_oom_op;
    if (p.passes.size() > 1) j["first_oom_pass"] = p.first_oom_pass;
    j["first_oom"] = p.first_oom;
  }
  j["peak_mapped_bytes"] = p.stats.peak_mapped_bytes;
  j["peak_physical_bytes"] = p.stats.peak_physical_bytes;
  j["peak_allocated_bytes"] = p.stats.peak_allocated_bytes;
  j["peak_va_reserved_bytes"] = p.stats.peak_va_reserved_bytes;
  j["created_pages"] = p.stats.num_created_pages;
  j["reclaimed_pages"] = p.stats.num_reclaimed_pages;
  j["released_pages"] = p.stats.num_released_pages;
  j["driver_calls"] = driver_calls_json(p.stats);
  j["driver_calls_total"] = p.stats.total_driver_calls();
  j["modeled_driver_seconds"] = p.stats.modeled_driver_ns * 1e-9;
  if (const auto f = preexisting_floor(r)) {
    j["preexisting_driver_floor"] = {{"blocks", f->blocks}, {"modeled_driver_seconds", f->seconds}};
  }
  if (const auto f = live_set_floor(r)) {
    j["live_set_driver_floor"] = {
        {"blocks", f->blocks}, {"op", f->op}, {"modeled_driver_seconds", f->seconds}};
  }
  if (p.page_size != 0 && !p.passes.empty() && p.passes.front().ooms == 0) {
    const replay::OnePageFloor f = replay::one_page_driver_floor(
        t.peak_live_bytes, p.page_size, driver::CostModel::get_default());
    j["one_page_driver_floor"] = {{"pages", f.pages}, {"modeled_driver_seconds", f.seconds}};
    const uint64_t peak_pages = (p.stats.peak_physical_bytes + p.page_size - 1) / p.page_size;
    if (!p.passes.empty() && peak_pages != 0) {
      j["first_pass_created_pages"] = p.passes.front().created_pages;
      j["first_pass_created_pages_per_peak_page"] =
          static_cast<double>(p.passes.front().created_pages) / static_cast<double>(peak_pages);
    }
  }
  j["passes"] = Json::array();
  for (const replay::PassResult& pass : p.passes) {
    Json calls = Json::object();
    for (size_t e = 0; e < pass.driver_calls.size(); ++e) {
      if (pass.driver_calls[e] != 0) {
        calls[driver::entry_point_name(static_cast<driver::EntryPoint>(e))] = pass.driver_calls[e];
      }
    }
    j["passes"].push_back({{"ooms", pass.ooms},
                           {"driver_calls_total", pass.driver_calls_total},
                           {"driver_calls", calls},
                           {"modeled_driver_seconds", pass.modeled_driver_seconds},
                           {"created_pages", pass.created_pages},
                           {"peak_physical_bytes", pass.peak_physical_bytes},
                           {"peak_mapped_bytes", pass.peak_mapped_bytes}});
  }
  if (r.min_capacity) {
    const MinCapacity& m = *r.min_capacity;
    j["min_capacity_bytes"] = m.bytes;
    j["min_capacity"] = {{"probes", m.probes},
                         {"wall_seconds", m.wall_seconds},
                         {"peak_mapped_bytes", m.at_min.stats.peak_mapped_bytes},
                         {"driver_calls_total", m.at_min.stats.total_driver_calls()},
                         {"modeled_driver_seconds", m.at_min.stats.modeled_driver_ns * 1e-9}};
  }
  j["load_seconds"] = r.load_seconds;
  j["replay_seconds"] = p.wall_seconds;
  j["wall_seconds"] = r.wall_seconds;
  return j;
}

std::string replay_text(const ReplayReport& r) {
  const Trace& t = r.trace;
  const ReplayResult& p = r.replay;
  const uint64_t live = t.peak_live_bytes;
  std::ostringstream o;
  o << "trace        " << t.path << "\n";
  o << "format       "
    << (t.format == "pytorch-snapshot"
            ? "PyTorch memory snapshot, device " + std::to_string(t.device)
            : std::string("RMM log CSV"))
    << ", " << t.streams.size() << " stream" << (t.streams.size() == 1 ? "" : "s") << "\n";
  o << "events       " << t.events << ": " << t.allocs << " allocs, " << t.frees << " frees";
  if (t.preexisting != 0) {
    o << ", " << t.preexisting << " blocks (" << conf::format_size(t.preexisting_bytes)
      << ") allocated before recording began";
  }
  if (t.failed_allocs != 0) o << ", " << t.failed_allocs << " failed allocations skipped";
  o << "\n";
  o << "peak live    " << bytes_text(live) << "\n";
  if (t.torch_peak_reserved_bytes) {
    o << "PyTorch      peak reserved " << bytes_text(*t.torch_peak_reserved_bytes)
      << ratio_text(*t.torch_peak_reserved_bytes, live) << "\n";
  }
  o << "device       sim, " << conf::format_size(p.capacity) << ", page "
    << conf::format_size(p.page_size) << "\n";
  o << "host         " << p.host.describe() << "\n";
  o << "expanse      peak mapped " << bytes_text(p.stats.peak_mapped_bytes)
    << ratio_text(p.stats.peak_mapped_bytes, live) << ", peak physical "
    << conf::format_size(p.stats.peak_physical_bytes) << "; pages created "
    << p.stats.num_created_pages << ", released " << p.stats.num_released_pages
    << ", reclaimed " << p.stats.num_reclaimed_pages << "\n";
  o << "OOMs         " << p.ooms;
  if (p.ooms != 0) {
    o << " (first at operation " << p.first_oom_op;
    if (p.passes.size() > 1) o << " of pass " << p.first_oom_pass;
    o << ": " << p.first_oom << ")";
  }
  o << "\n";
  o << "driver       " << calls_text(p.stats) << ", modeled "
    << fixed(p.stats.modeled_driver_ns * 1e-9, 3) << " s\n";
  if (const auto f = preexisting_floor(r)) {
    o << "floor        " << fixed(f->seconds, 3) << " s modeled, whatever the placement, to back "
      << f->blocks << " block" << (f->blocks == 1 ? "" : "s")
      << " of 2+ pages live at the start without sharing a handle (invariant 1)\n";
  }
  if (const auto f = live_set_floor(r)) {
    o << "live floor   " << fixed(f->seconds, 3) << " s modeled, whatever the placement, to back "
      << f->blocks << " block" << (f->blocks == 1 ? "" : "s")
      << " of a page or more live at once (after operation " << f->op
      << ") without sharing a handle (invariant 1)\n";
  }
  if (p.page_size != 0 && !p.passes.empty() && p.passes.front().ooms == 0) {
    const replay::OnePageFloor f = replay::one_page_driver_floor(
        t.peak_live_bytes, p.page_size, driver::CostModel::get_default());
    const uint64_t peak_pages = (p.stats.peak_physical_bytes + p.page_size - 1) / p.page_size;
    o << "page floor   " << fixed(f.seconds, 3) << " s modeled to create, map and grant the "
      << f.pages << " pages of peak live one at a time (what a workload whose block boundaries "
      << "move needs); the first pass created " << p.passes.front().created_pages << " pages, "
      << fixed(peak_pages ? static_cast<double>(p.passes.front().created_pages) /
                                static_cast<double>(peak_pages)
                          : 0.0,
               2)
      << " x its peak\n";
  }
  if (p.passes.size() > 1) {
    for (size_t i = 0; i < p.passes.size(); ++i) {
      const replay::PassResult& pass = p.passes[i];
      std::string label = "pass " + std::to_string(i + 1);
      label.resize(std::max<size_t>(label.size() + 1, 13), ' ');
      o << label << pass.driver_calls_total << " driver calls, modeled "
        << fixed(pass.modeled_driver_seconds, 3) << " s, peak physical "
        << conf::format_size(pass.peak_physical_bytes) << ", " << pass.ooms << " OOMs\n";
    }
  }
  if (r.min_capacity) {
    const MinCapacity& m = *r.min_capacity;
    o << "min capacity " << bytes_text(m.bytes) << ratio_text(m.bytes, live) << " ("
      << m.probes << " replays, " << fixed(m.wall_seconds, 2) << " s)\n";
  }
  o << "time         " << fixed(r.wall_seconds, 2) << " s (read " << fixed(r.load_seconds, 2)
    << " s, replay " << fixed(p.wall_seconds, 2) << " s)\n";
  return o.str();
}

namespace {

// The request's modeled driver time against the unreserved run's; null when that made no call.
Json cost_ratio(const core::DeviceStats& calls, const StressResult::OtherRun& unreserved) {
  if (!unreserved.ran || unreserved.calls.modeled_driver_ns <= 0) return Json(nullptr);
  return Json(calls.modeled_driver_ns / unreserved.calls.modeled_driver_ns);
}

Json other_run_json(const StressResult::OtherRun& u) {
  return {{"allocated", u.allocated},
          {"alloc_seconds", u.alloc_seconds},
          {"pages_reclaimed", u.pages_reclaimed},
          {"pages_created", u.pages_created},
          {"physical_low_water_bytes", u.physical_low_water_bytes},
          {"stranded_bytes", u.stranded_bytes},
          {"request_mem_creates",
           u.calls.driver_calls[static_cast<size_t>(driver::EntryPoint::mem_create)]},
          {"driver_calls_total", u.calls.total_driver_calls()},
          {"modeled_driver_seconds", u.calls.modeled_driver_ns * 1e-9},
          {"total_driver_calls", u.stats.total_driver_calls()},
          {"total_modeled_driver_seconds", u.stats.modeled_driver_ns * 1e-9}};
}

}  // namespace

Json stress_json(const StressResult& r) {
  Json j;
  j["ok"] = r.allocated && r.verified;
  j["driver"] = r.driver;
  j["sim"] = r.sim;
  j["capacity_bytes"] = r.capacity;
  j["page_size_bytes"] = r.page_size;
  j["size_bytes"] = r.size;
  j["seed"] = r.seed;
  j["streams"] = r.streams;
  j["workload"] = {{"allocs", r.workload_allocs},
                   {"frees", r.workload_frees},
                   {"skipped_ooms", r.workload_ooms},
                   {"seconds", r.workload_seconds}};
  j["before"] = {{"live_blocks", r.live_blocks_before},
                 {"live_bytes", r.live_bytes_before},
                 {"touched_bytes", r.touched_bytes_before},
                 {"mapped_bytes", r.mapped_bytes_before},
                 {"cached_bytes", r.cached_bytes_before},
                 {"free_physical_bytes", r.free_physical_before}};
  j["allocated"] = r.allocated;
  j["alloc_seconds"] = r.alloc_seconds;
  j["pages_reclaimed"] = r.pages_reclaimed;
  j["pages_created"] = r.pages_created;
  j["reserved_bytes"] = r.reserved_bytes;
  j["reserve_asked_bytes"] = r.reserve_asked_bytes;
  j["physical_low_water_bytes"] = r.physical_low_water_bytes;
  j["stranded_bytes"] = r.stranded_bytes;
  j["neighbour"] = r.neighbour;
  if (r.neighbour) j["neighbour_bytes"] = r.neighbour_bytes;
  j["request_mem_creates"] = r.calls.driver_calls[static_cast<size_t>(driver::EntryPoint::mem_create)];
  j["driver_calls"] = driver_calls_json(r.calls);
  j["driver_calls_total"] = r.calls.total_driver_calls();
  j["modeled_driver_seconds"] = r.calls.modeled_driver_ns * 1e-9;
  j["verified"] = r.verified;
  j["pages_verified"] = r.pages_verified;
  j["live_blocks_verified"] = r.live_blocks_verified;
  j["verify_seconds"] = r.verify_seconds;
  if (!r.error.empty()) j["error"] = r.error;
  if (r.sim) j["host_resident_bytes"] = r.host_resident_bytes;
  j["total_driver_calls"] = r.stats.total_driver_calls();
  j["total_modeled_driver_seconds"] = r.stats.modeled_driver_ns * 1e-9;
  j["wall_seconds"] = r.wall_seconds;
  if (r.unreserved.ran) {
    j["unreserved"] = other_run_json(r.unreserved);
    j["modeled_vs_unreserved"] = cost_ratio(r.calls, r.unreserved);
  }
  if (r.one_page_handles.ran) {
    j["one_page_handles"] = other_run_json(r.one_page_handles);
    j["one_page_handles"]["modeled_vs_unreserved"] =
        cost_ratio(r.one_page_handles.calls, r.unreserved);
  }
  return j;
}

std::string stress_text(const StressResult& r) {
  std::ostringstream o;
  o << "driver       " << r.driver << "\n";
  if (r.sim) o << "             (no GPU in use: the sim backs device pages with host memory)\n";
  o << "device       " << conf::format_size(r.capacity) << ", page "
    << conf::format_size(r.page_size) << ", " << r.streams << " streams, seed " << r.seed << "\n";
  o << "workload     " << r.workload_allocs << " allocs, " << r.workload_frees << " frees of 512 B"
    << " .. 1 GiB tensors in " << fixed(r.workload_seconds, 2) << " s";
  if (r.workload_ooms != 0) o << " (" << r.workload_ooms << " requests did not fit)";
  o << "\n";
  o << "before       " << r.live_blocks_before << " live blocks, "
    << conf::format_size(r.live_bytes_before) << " live, "
    << conf::format_size(r.cached_bytes_before) << " cached between them, "
    << conf::format_size(r.free_physical_before) << " physical free\n";
  o << "request      " << conf::format_size(r.size) << " contiguous: "
    << (r.allocated ? "allocated" : "FAILED") << " in " << fixed(r.alloc_seconds * 1e3, 1)
    << " ms (" << r.pages_reclaimed << " pages reclaimed from under free memory, "
    << r.pages_created << " created)\n";
  if (r.reserve_asked_bytes != 0) {
    o << "reserve      " << conf::format_size(r.reserved_bytes) << " held";
    if (r.reserve_asked_bytes > r.reserved_bytes) {
      o << " (asked " << conf::format_size(r.reserve_asked_bytes) << ": partial)";
    }
    o << "; the request made "
      << r.calls.driver_calls[static_cast<size_t>(driver::EntryPoint::mem_create)]
      << " cuMemCreate\n";
    o << "low water    " << conf::format_size(r.physical_low_water_bytes)
      << " held at the least since the reservation was made"
      << (r.physical_low_water_bytes >= r.reserved_bytes ? " (never below it)" : " (BELOW it)");
    if (r.stranded_bytes != 0) {
      o << "; " << conf::format_size(r.stranded_bytes) << " reserved pages taken whole beyond"
        << " the request";
    }
    o << "\n";
  }
  if (r.neighbour) {
    o << "neighbour    another process took every free byte after each cuMemRelease: it held "
      << conf::format_size(r.neighbour_bytes) << " at the request\n";
  }
  o << "driver       " << calls_text(r.calls) << ", modeled "
    << fixed(r.calls.modeled_driver_ns * 1e-9, 3) << " s for the request ("
    << r.stats.total_driver_calls() << " calls, " << fixed(r.stats.modeled_driver_ns * 1e-9, 3)
    << " s in all)\n";
  if (r.unreserved.ran) {
    const auto& u = r.unreserved;
    o << "unreserved   the same run without the reservation: ";
    if (!u.allocated) o << "the request FAILED; ";
    o << calls_text(u.calls) << ", modeled " << fixed(u.calls.modeled_driver_ns * 1e-9, 3)
      << " s for the request";
    if (u.calls.modeled_driver_ns > 0) {
      o << " (with it: " << fixed(r.calls.modeled_driver_ns / u.calls.modeled_driver_ns, 2)
        << " x)";
    }
    o << "; " << u.stats.total_driver_calls() << " calls, "
      << fixed(u.stats.modeled_driver_ns * 1e-9, 3) << " s in all\n";
  }
  if (r.one_page_handles.ran) {
    const auto& p = r.one_page_handles;
    o << "one-page     the same run with one-page reserved handles: ";
    if (!p.allocated) o << "the request FAILED; ";
    o << calls_text(p.calls) << ", modeled " << fixed(p.calls.modeled_driver_ns * 1e-9, 3)
      << " s for the request";
    if (r.unreserved.ran && r.unreserved.calls.modeled_driver_ns > 0) {
      o << " (" << fixed(p.calls.modeled_driver_ns / r.unreserved.calls.modeled_driver_ns, 2)
        << " x unreserved)";
    }
    o << ", low water " << conf::format_size(p.physical_low_water_bytes) << "; "
      << p.stats.total_driver_calls() << " calls, " << fixed(p.stats.modeled_driver_ns * 1e-9, 3)
      << " s in all\n";
  }
  if (r.verified) {
    o << "verified     a word in each of " << r.pages_verified << " pages of the block, and "
      << r.live_blocks_verified << " live blocks kept their data (" << fixed(r.verify_seconds, 2)
      << " s)\n";
  }
  if (!r.error.empty()) o << "error        " << r.error << "\n";
  o << "result       " << (r.allocated && r.verified ? "OK" : "FAILED") << " in "
    << fixed(r.wall_seconds, 2) << " s\n";
  return o.str();
}

nlohmann::ordered_json pinned_stress_json(const replay::PinnedStressResult& r) {
  nlohmann::ordered_json j;
  j["driver"] = r.driver;
  j["sim"] = r.sim;
  j["host_capacity"] = r.capacity;
  j["page_size"] = r.page_size;
  j["size"] = r.size;
  j["seed"] = r.seed;
  j["blocks_made"] = r.blocks_made;
  j["live_bytes_at_request"] = r.live_at_request;
  j["pinned_bytes_at_request"] = r.pinned_at_request;
  j["free_holes_at_request"] = r.free_holes;
  j["allocated"] = r.allocated;
  if (!r.allocated) j["error"] = r.error;
  j["verified"] = r.verified;
  j["pages_verified"] = r.pages_verified;
  j["remapped_pages"] = r.remapped_pages;
  j["peak_pinned_bytes"] = r.peak_pinned;
  nlohmann::ordered_json t;
  t["pinned_bytes_at_request"] = r.torch_pinned_at_request;
  t["live_pinned_bytes"] = r.torch_live_pinned;
  t["request_pinned_bytes"] = r.torch_request_pinned;
  t["fits"] = r.torch_fits;
  t["fits_after_empty_cache"] = r.torch_fits_after_empty_cache;
  j["pytorch_host_allocator_model"] = t;
  j["seconds"] = r.seconds;
  return j;
}

std::string pinned_stress_text(const replay::PinnedStressResult& r) {
  std::ostringstream o;
  using conf::format_size;
  o << "driver       " << r.driver << "\n";
  o << "host pool    " << format_size(r.capacity) << " of pinned host memory"
    << (r.sim ? " (the sim's host capacity for this run: --capacity)" : " (the limit)")
    << ", pages of " << format_size(r.page_size) << "\n";
  o << "workload     " << r.blocks_made << " offload-sized blocks, freed in random order until "
    << format_size(r.live_at_request) << " stayed live in " << r.free_holes << " holes ("
    << format_size(r.pinned_at_request) << " pinned)\n";
  o << "request      " << format_size(r.size) << " contiguous: "
    << (r.allocated ? "allocated" : "FAILED: " + r.error) << "\n";
  if (r.allocated) {
    o << "verified     " << (r.verified ? "yes" : "NO") << ", " << r.pages_verified
      << " pages; " << r.remapped_pages << " pages moved from under free memory; peak pinned "
      << format_size(r.peak_pinned) << "\n";
  }
  o << "PyTorch      its host allocator would pin " << format_size(r.torch_request_pinned)
    << " for the request beside the " << format_size(r.torch_pinned_at_request)
    << " it needs for the same blocks (live and cached powers of two): "
    << (r.torch_fits ? "fits" : "does not fit") << "; after empty_cache "
    << format_size(r.torch_live_pinned) << " held: "
    << (r.torch_fits_after_empty_cache ? "fits" : "does not fit") << "\n";
  return o.str();
}

}  // namespace expanse::tools
