#include "selftest.hpp"

#include "selftest_calibrate.hpp"
#include "selftest_checks.hpp"
#include "selftest_env.hpp"

#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <chrono>
#include <cstdio>
#include <sstream>

namespace expanse::tools {
namespace {

using driver::EntryPoint;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

void describe_device(const selftest::Env& e, SelftestReport& r) {
  int version = 0;
  e.ok(e.t.driver_get_version(&version), "cuDriverGetVersion");
  r.driver_version = version_text(version);
  char name[256] = {};
  e.ok(e.t.device_get_name(name, sizeof name - 1, e.dev), "cuDeviceGetName");
  r.device = name;
  e.ok(e.t.device_total_mem(&r.capacity, e.dev), "cuDeviceTotalMem");
  const selftest::Current current(e);
  r.free = e.free_bytes();
  r.granularity = e.granularity;
}

void run_checks(const selftest::Env& e, const SelftestOptions& o, SelftestReport& r) {
  const auto& checks = selftest::all_checks();
  for (size_t i = 0; i < checks.size(); ++i) {
    if (o.progress) {
      o.progress(static_cast<double>(i) / static_cast<double>(checks.size()),
                 std::string("checking ") + checks[i].name);
    }
    CheckResult c;
    c.name = checks[i].name;
    try {
      const selftest::Current current(e);
      c.message = checks[i].run(e);
      c.ok = true;
    } catch (const selftest::Failed& f) {
      c.message = f.message;
    } catch (const std::exception& x) {
      c.message = x.what();
    }
    r.checks.push_back(std::move(c));
  }
}

void run_calibration(const selftest::Env& e, const SelftestOptions& o, SelftestReport& r) {
  const auto t0 = Clock::now();
  selftest::CalibrationOptions c;
  c.repetitions = std::max(o.repetitions, 1);
  c.max_handle = o.max_handle;
  c.max_range = o.max_range;
  c.progress = o.progress;
  r.repetitions = c.repetitions;
  CheckResult check{"calibration", false, ""};
  try {
    const selftest::Current current(e);
    c.budget = e.free_bytes() / 2;
    r.cost_table = selftest::calibrate(e, c);
    size_t points = 0;
    for (const auto& [ep, v] : r.cost_table.by_bytes) points = v.size();
    check.ok = points > 0;
    check.message = std::to_string(points) + " handle sizes, " +
                    std::to_string(r.cost_table.by_mappings[EntryPoint::mem_unmap].size()) +
                    " range lengths, median of " + std::to_string(c.repetitions);
    if (!check.ok) check.message = "less than one granularity of free memory to measure with";
  } catch (const selftest::Failed& f) {
    check.message = f.message;
  }
  r.checks.push_back(std::move(check));
  r.calibration_seconds = seconds_since(t0);
}

void run_stress_part(const SelftestOptions& o, SelftestReport& r) {
  r.stress_ran = true;
  StressOptions s;
  s.conf = o.conf;
  // Sized to what is free: on the sim the device's capacity, on a GPU a limit on the allocator
  // (leaving a tenth for the context and other processes).
  s.capacity = r.free / 10 * 9 / r.granularity * r.granularity;
  if (o.progress) {
    s.progress = [&o](double f, const std::string& phase) { o.progress(f, "stress: " + phase); };
  }
  try {
    r.stress = run_stress(s);
    if (!r.stress.allocated || !r.stress.verified) r.stress_error = r.stress.error;
  } catch (const std::exception& x) {
    r.stress_error = x.what();
  }
}

std::string micros(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%10.1f", s * 1e6);
  return b;
}

}  // namespace

bool SelftestReport::ok() const {
  for (const CheckResult& c : checks) {
    if (!c.ok) return false;
  }
  return stress_ok();
}

SelftestReport run_selftest(const driver::LoadedDriver& drv, const SelftestOptions& o) {
  const auto t0 = Clock::now();
  SelftestReport r;
  r.driver = drv.description();
  r.sim = drv.kind() == driver::DriverKind::sim;
  r.ordinal = o.device;
  {
    std::unique_ptr<selftest::Env> env;
    try {
      env = std::make_unique<selftest::Env>(drv, o.device);
      describe_device(*env, r);
    } catch (const driver::driver_error& e) {
      throw driver_failure(e.what(), static_cast<int>(e.code()));
    } catch (const selftest::Failed& f) {
      throw driver_failure(f.message, 0);
    }
    run_checks(*env, o, r);
    run_calibration(*env, o, r);
  }
  // Last: on the in-process sim the stress loads (and so resets) the sim again.
  if (o.stress) run_stress_part(o, r);
  r.wall_seconds = seconds_since(t0);
  return r;
}

SelftestReport run_selftest(const SelftestOptions& o) {
  std::unique_ptr<driver::LoadedDriver> drv;
  try {
    drv = driver::select_driver(o.conf, true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(e.what(), static_cast<int>(e.code()));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  return run_selftest(*drv, o);
}

Json selftest_json(const SelftestReport& r) {
  Json j;
  j["ok"] = r.ok();
  j["device"] = r.device;
  j["device_ordinal"] = r.ordinal;
  j["driver"] = r.driver;
  j["driver_kind"] = r.sim ? "sim" : "cuda";
  j["driver_version"] = r.driver_version;
  j["capacity_bytes"] = r.capacity;
  j["free_bytes"] = r.free;
  j["granularity_bytes"] = r.granularity;
  Json checks = Json::array();
  for (const CheckResult& c : r.checks) {
    checks.push_back({{"name", c.name}, {"ok", c.ok}, {"message", c.message}});
  }
  j["checks"] = checks;
  Json s;
  s["ok"] = r.stress_ok();
  s["ran"] = r.stress_ran;
  if (r.stress_ran) {
    s["capacity_bytes"] = r.stress.capacity;
    s["size_bytes"] = r.stress.size;
    s["allocated"] = r.stress.allocated;
    s["verified"] = r.stress.verified;
    s["pages_verified"] = r.stress.pages_verified;
    s["live_blocks_verified"] = r.stress.live_blocks_verified;
    s["alloc_seconds"] = r.stress.alloc_seconds;
    s["wall_seconds"] = r.stress.wall_seconds;
    s["error"] = r.stress_error;
  }
  j["stress"] = s;
  j["cost_table"] = cost_table_json(r.cost_table);
  j["calibration"] = {{"statistic", "median"},
                      {"repetitions", r.repetitions},
                      {"seconds", r.calibration_seconds}};
  j["wall_seconds"] = r.wall_seconds;
  return j;
}

std::string selftest_text(const SelftestReport& r) {
  std::ostringstream o;
  o << "expanse selftest: device " << r.ordinal << " \"" << r.device << "\", "
    << conf::format_size(r.capacity) << " (" << conf::format_size(r.free) << " free), granularity "
    << conf::format_size(r.granularity) << "\n";
  o << "driver: " << (r.sim ? "sim" : "cuda") << " (" << r.driver << "), version "
    << r.driver_version << "\n\n";
  size_t passed = 0;
  for (const CheckResult& c : r.checks) passed += c.ok ? 1 : 0;
  o << "checks: " << passed << "/" << r.checks.size() << " passed\n";
  for (const CheckResult& c : r.checks) {
    char name[40];
    std::snprintf(name, sizeof name, "%-31s", c.name.c_str());
    o << "  " << (c.ok ? "ok    " : "FAIL  ") << name << " " << c.message << "\n";
  }
  o << "\nstress: ";
  if (!r.stress_ran) {
    o << "not run\n";
  } else if (r.stress_ok()) {
    o << "ok: " << conf::format_size(r.stress.size) << " contiguous on a fragmented "
      << conf::format_size(r.stress.capacity) << ", " << r.stress.pages_verified << " pages and "
      << r.stress.live_blocks_verified << " live blocks verified through cuMemcpyHtoD/DtoH\n";
  } else {
    o << "FAILED: " << r.stress_error << "\n";
  }

  const auto& bb = r.cost_table.by_bytes;
  if (!bb.empty()) {
    o << "\ncost table (microseconds per call, median of " << r.repetitions << "):\n";
    o << "  handle      ";
    for (const auto& [e, v] : bb) {
      std::string n = driver::entry_point_name(e);
      if (n.rfind("cuMem", 0) == 0) n = n.substr(5);
      char col[16];
      std::snprintf(col, sizeof col, " %13s", n.c_str());
      o << col;
    }
    o << "\n";
    const size_t rows = bb.begin()->second.size();
    for (size_t i = 0; i < rows; ++i) {
      char size[16];
      std::snprintf(size, sizeof size, "  %-10s",
                    conf::format_size(static_cast<size_t>(bb.begin()->second[i].x)).c_str());
      o << size << "  ";
      for (const auto& [e, v] : bb) o << "    " << micros(v[i].seconds);
      o << "\n";
    }
  }
  const auto& rm = r.cost_table.by_mappings;
  if (!rm.empty()) {
    o << "ranges (one call over N mappings of "
      << conf::format_size(static_cast<size_t>(r.cost_table.mapping_bytes)) << "):\n";
    o << "  N           ";
    for (const auto& [e, v] : rm) {
      char col[24];
      std::snprintf(col, sizeof col, " %14s", driver::entry_point_name(e));
      o << col;
    }
    o << "\n";
    const size_t rows = rm.begin()->second.size();
    for (size_t i = 0; i < rows; ++i) {
      char n[16];
      std::snprintf(n, sizeof n, "  %-10zu", static_cast<size_t>(rm.begin()->second[i].x));
      o << n << "  ";
      for (const auto& [e, v] : rm) o << "     " << micros(v[i].seconds);
      o << "\n";
    }
  }
  o << "\nresult: " << (r.ok() ? "PASS" : "FAIL") << " (" << r.wall_seconds << " s)\n";
  return o.str();
}

}  // namespace expanse::tools
