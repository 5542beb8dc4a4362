// expanse — the command-line tool: info, stress, replay, selftest (see docs/cli.md).
//
// Exit status: 0 success; 1 the run completed but failed (stress: block not allocated or not
// verified; replay: OOMs at --capacity); 2 bad usage or bad input (unknown flag, bad size,
// unreadable or malformed trace); 3 driver or internal error. selftest: 1 when a check or its
// stress failed.

#include "cost_table_json.hpp"
#include "info.hpp"
#include "progress.hpp"
#include "replay.hpp"
#include "report.hpp"
#include "selftest.hpp"
#include "stress.hpp"
#include "trace.hpp"

#include "api/config.hpp"
#include "driver/env_config.hpp"
#include "expanse/errors.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

namespace {

using namespace expanse;
using namespace expanse::tools;
using Clock = std::chrono::steady_clock;

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr int kInternal = 3;

// A SIZE argument ("80GiB", "3.5GiB", "4096"), parsed by the same rules as EXPANSE_CONF.
size_t size_arg(const char* cmd, const char* flag, const std::string& text) {
  try {
    return conf::parse_size(text);
  } catch (const std::invalid_argument& e) {
    throw usage_error(std::string(cmd) + ": " + flag + ": " + e.what());
  }
}

void print_json(const nlohmann::ordered_json& j) { std::cout << j.dump(2) << "\n"; }

int cmd_info(bool json) {
  auto info = gather_info(conf::from_environment());
  if (json) {
    print_json(info);
  } else {
    std::cout << format_info(info);
  }
  return kOk;
}

struct StressArgs {
  std::string capacity, size;
  uint64_t seed = 1;
  int streams = 4;
  bool json = false;
  std::string cost_table;
};

int cmd_stress(const StressArgs& a) {
  if (!a.cost_table.empty()) install_cost_table_file(a.cost_table);
  StressOptions o;
  if (!a.capacity.empty()) o.capacity = size_arg("stress", "--capacity", a.capacity);
  if (!a.size.empty()) o.size = size_arg("stress", "--size", a.size);
  if (!a.capacity.empty() && o.capacity == 0) throw usage_error("stress: --capacity is 0");
  if (!a.size.empty() && o.size == 0) throw usage_error("stress: --size is 0");
  o.seed = a.seed;
  o.streams = a.streams;
  o.conf = conf::from_environment();
  ProgressBar bar(stderr_is_terminal());
  o.progress = [&bar](double f, const std::string& phase) { bar.update(f, "stress: " + phase); };
  StressResult r = run_stress(o);
  bar.clear();
  if (a.json) {
    print_json(stress_json(r));
  } else {
    std::cout << stress_text(r);
  }
  return r.allocated && r.verified ? kOk : kFailed;
}

struct ReplayArgs {
  std::string file, capacity;
  bool min_capacity = false;
  int device = -1;
  bool json = false;
  std::string cost_table;
};

int cmd_replay(const ReplayArgs& a) {
  if (!a.cost_table.empty()) install_cost_table_file(a.cost_table);
  const auto t0 = Clock::now();
  const api::Config conf = api::parse_config(conf::from_environment());
  const size_t g = replay_granularity(conf);
  size_t capacity = size_t{80} << 30;
  if (!a.capacity.empty()) {
    capacity = size_arg("replay", "--capacity", a.capacity) / g * g;
    if (capacity == 0) {
      throw usage_error("replay: --capacity " + a.capacity +
                        " is less than one page of " + conf::format_size(g));
    }
  }

  ProgressBar bar(stderr_is_terminal());
  bar.update(0, "reading " + a.file);
  Trace trace = load_trace(a.file, a.device);
  ReplayReport rep;
  rep.trace = &trace;
  rep.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  rep.replay = replay(trace, conf, capacity, false, [&](uint64_t done, uint64_t total) {
    bar.update(total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total),
               "replay");
  });
  if (a.min_capacity) {
    rep.min_capacity = find_min_capacity(
        trace, conf, capacity, [&](int probe, int expected, uint64_t done, uint64_t total) {
          const double within = total == 0 ? 1.0 : static_cast<double>(done) /
                                                        static_cast<double>(total);
          bar.update((probe - 1 + within) / expected,
                     "min-capacity: replay " + std::to_string(probe) + "/" +
                         std::to_string(expected));
        });
  }
  bar.clear();
  rep.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (a.json) {
    print_json(replay_json(rep));
  } else {
    std::cout << replay_text(rep);
  }
  return rep.replay.ooms == 0 ? kOk : kFailed;
}

struct SelftestArgs {
  bool json = false;
  std::string report;
  int repetitions = 5;
};

int cmd_selftest(const SelftestArgs& a) {
  SelftestOptions o;
  o.conf = conf::from_environment();
  o.repetitions = a.repetitions;
  ProgressBar bar(stderr_is_terminal());
  o.progress = [&bar](double f, const std::string& phase) { bar.update(f, "selftest: " + phase); };
  const SelftestReport r = run_selftest(o);
  bar.clear();
  if (!a.report.empty()) {
    std::ofstream out(a.report);
    out << selftest_json(r).dump(2) << "\n";
    if (!out) throw usage_error("selftest: --report " + a.report + ": cannot write the file");
  }
  if (a.json) {
    print_json(selftest_json(r));
  } else {
    std::cout << selftest_text(r);
    if (!a.report.empty()) std::cout << "report: " << a.report << "\n";
  }
  return r.ok() ? kOk : kFailed;
}

// "expanse: <message>", without doubling a prefix the message has already.
void print_error(const char* kind, const char* what) {
  const std::string m = what;
  if (m.rfind("expanse", 0) == 0) {
    std::fprintf(stderr, "%s%s\n", kind, what);
  } else {
    std::fprintf(stderr, "expanse: %s%s\n", kind, what);
  }
}

int run(int argc, char** argv) {
  CLI::App app{"expanse: a virtual-memory GPU allocator; tools to inspect, stress and replay"};
  app.name("expanse");
  app.set_version_flag("--version", "expanse 0.1.0");
  app.require_subcommand(1);

  bool info_json = false;
  CLI::App* info = app.add_subcommand(
      "info", "Driver in use (cuda or sim, and why), devices, capacity, granularity, "
              "effective configuration (EXPANSE_CONF)");
  info->add_flag("--json", info_json, "Print one JSON object");

  StressArgs sa;
  CLI::App* stress = app.add_subcommand(
      "stress", "Fragment a device with an inference server's mix of allocations, then ask for "
                "one contiguous block and verify every page of it");
  stress->add_option("--capacity", sa.capacity,
                     "Device capacity on the sim (default: EXPANSE_CONF sim_capacity, 80GiB); "
                     "a limit on a real GPU")
      ->type_name("SIZE");
  stress->add_option("--size", sa.size,
                     "The contiguous block (default: 2/5 of the capacity, 32GiB on 80GiB)")
      ->type_name("SIZE");
  stress->add_option("--seed", sa.seed, "Workload seed (default 1)")->type_name("N");
  stress->add_option("--streams", sa.streams, "Streams the workload uses (default 4)")
      ->type_name("N")
      ->check(CLI::Range(1, 64));
  stress->add_flag("--json", sa.json, "Print one JSON object");
  stress->add_option("--cost-table", sa.cost_table,
                     "Price driver calls with a measured cost table (expanse selftest --report)")
      ->type_name("FILE");

  ReplayArgs ra;
  CLI::App* replay_cmd = app.add_subcommand(
      "replay", "Replay a PyTorch memory snapshot pickle or an RMM log CSV on a sim device");
  replay_cmd->add_option("FILE", ra.file, "Trace: snapshot .pickle or RMM log .csv")
      ->required();
  replay_cmd->add_option("--capacity", ra.capacity, "Device capacity (default 80GiB)")
      ->type_name("SIZE");
  replay_cmd->add_flag("--min-capacity", ra.min_capacity,
                       "Also find the smallest capacity that replays with no OOM");
  replay_cmd->add_option("--device", ra.device,
                         "Snapshot device to replay (default: the one with most allocations)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  replay_cmd->add_flag("--json", ra.json, "Print one JSON object");
  replay_cmd->add_option("--cost-table", ra.cost_table,
                         "Price driver calls with a measured cost table (expanse selftest --report)")
      ->type_name("FILE");

  SelftestArgs ta;
  CLI::App* selftest_cmd = app.add_subcommand(
      "selftest", "Check that the driver in use (GPU or sim) keeps the rules expanse relies on, "
                  "stress it, and measure what its VMM calls cost");
  selftest_cmd->add_flag("--json", ta.json, "Print one JSON object");
  selftest_cmd->add_option("--report", ta.report, "Also write the JSON report to FILE")
      ->type_name("FILE");
  selftest_cmd->add_option("--repetitions", ta.repetitions,
                           "Calls per calibration point; the median is kept (default 5)")
      ->type_name("N")
      ->check(CLI::Range(1, 1000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "expanse: %s\nRun 'expanse --help' for usage.\n", e.what());
    return kUsage;
  }

  try {
    if (*info) return cmd_info(info_json);
    if (*stress) return cmd_stress(sa);
    if (*replay_cmd) return cmd_replay(ra);
    if (*selftest_cmd) return cmd_selftest(ta);
  } catch (const input_error& e) {
    print_error("", e.what());
    return kUsage;
  } catch (const usage_error& e) {
    print_error("", e.what());
    return kUsage;
  } catch (const driver_failure& e) {
    print_error("driver error: ", e.what());
    return kInternal;
  } catch (const std::exception& e) {
    print_error("error: ", e.what());
    return kInternal;
  }
  return kUsage;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse: error: %s\n", e.what());
    return kInternal;
  }
}
