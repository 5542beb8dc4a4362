// expanse — the command-line tool: info, stress, replay, selftest (see docs/cli.md).
//
// Exit status: 0 success; 1 the run completed but failed (stress: block not allocated or not
// verified; replay: OOMs at --capacity); 2 bad usage or bad input (unknown flag, bad size,
// unreadable or malformed trace); 3 driver or internal error. selftest: 1 when a check or its
// stress failed.

#include "compare_report.hpp"
#include "cost_table_json.hpp"
#include "info.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "selftest.hpp"
#include "workloads/stress.hpp"

#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"
#include "report/memory_plot.hpp"
#include "report/replay_report.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

namespace {

using namespace expanse;
using namespace expanse::tools;

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
  std::string reserve;
  bool neighbour = false;
  bool pinned = false;
};

int cmd_stress(const StressArgs& a) {
  if (a.pinned) {
    if (a.neighbour || !a.reserve.empty()) {
      throw usage_error("stress: --pinned takes neither --neighbour nor --reserve");
    }
    replay::PinnedStressOptions o;
    if (!a.capacity.empty()) o.capacity = size_arg("stress", "--capacity", a.capacity);
    if (!a.size.empty()) o.size = size_arg("stress", "--size", a.size);
    o.seed = a.seed;
    o.conf = conf::from_environment();
    const replay::PinnedStressResult r = replay::run_pinned_stress(o);
    if (a.json) {
      print_json(pinned_stress_json(r));
    } else {
      std::cout << pinned_stress_text(r);
    }
    return r.allocated && r.verified ? kOk : kFailed;
  }
  if (!a.cost_table.empty()) install_cost_table_file(a.cost_table);
  StressOptions o;
  if (!a.capacity.empty()) o.capacity = size_arg("stress", "--capacity", a.capacity);
  if (!a.size.empty()) o.size = size_arg("stress", "--size", a.size);
  if (!a.capacity.empty() && o.capacity == 0) throw usage_error("stress: --capacity is 0");
  if (!a.size.empty() && o.size == 0) throw usage_error("stress: --size is 0");
  o.seed = a.seed;
  o.streams = a.streams;
  o.conf = conf::from_environment();
  o.reserve = a.reserve;
  o.neighbour = a.neighbour;
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
  int repeat = 1;
  int device = -1;
  bool json = false;
  bool compare = false;
  std::string plot, torch_conf;  // either implies compare
  std::string cost_table;
  std::string host;
};

int cmd_replay(const ReplayArgs& a) {
  if (!a.cost_table.empty()) install_cost_table_file(a.cost_table);
  replay::ReplayRequest req;
  req.path = a.file;
  req.device = a.device;
  req.conf = conf::parse_config(conf::from_environment());
  req.min_capacity = a.min_capacity;
  req.repeat = a.repeat;
  if (!a.host.empty()) req.host = replay::parse_host_model(a.host);
  const size_t g = replay::replay_granularity(req.conf);
  req.capacity = size_t{80} << 30;
  if (!a.capacity.empty()) {
    req.capacity = size_arg("replay", "--capacity", a.capacity) / g * g;
    if (req.capacity == 0) {
      throw usage_error("replay: --capacity " + a.capacity +
                        " is less than one page of " + conf::format_size(g));
    }
    if (req.capacity > replay::kMaxReplayCapacity) {
      throw usage_error("replay: --capacity " + a.capacity + " is more than replay models (" +
                        conf::format_size(replay::kMaxReplayCapacity) + ")");
    }
  }

  replay::CompareRequest creq;
  const bool compare = a.compare || !a.plot.empty() || !a.torch_conf.empty();
  if (!a.torch_conf.empty()) {
    try {
      creq.torch_conf = trace::parse_torch_conf(a.torch_conf);
    } catch (const std::invalid_argument& e) {
      throw usage_error(std::string("replay: --torch-conf: ") + e.what());
    }
  }
  creq.min_capacity = a.min_capacity;
  creq.series = !a.plot.empty();

  ProgressBar bar(stderr_is_terminal());
  const replay::ReplayReport rep = replay::make_replay_report(
      req, [&bar](double f, const std::string& label) { bar.update(f, label); });
  std::optional<replay::CompareReport> cmp;
  if (compare) {
    bar.update(1, "compare: PyTorch's allocators");
    cmp = replay::make_compare_report(rep, req.conf, creq);
  }
  bar.clear();
  if (!a.plot.empty()) {
    std::ofstream out(a.plot, std::ios::binary);
    const std::string name = std::filesystem::path(a.file).filename().string();
    out << replay::compare_plot_svg(*cmp, "Memory replaying " + name);
    if (!out) throw usage_error("replay: --plot: cannot write " + a.plot);
  }
  const uint64_t live = rep.trace.peak_live_bytes;
  if (a.json) {
    nlohmann::ordered_json j = replay_json(rep);
    if (cmp) j["compare"] = compare_json(*cmp);
    print_json(j);
  } else {
    std::cout << replay_text(rep);
    if (cmp) std::cout << compare_text(*cmp, live);
    if (!a.plot.empty()) std::cout << "plot written to " << a.plot << "\n";
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
  stress->add_option("--reserve", sa.reserve,
                     "Hold memory from the first allocation (EXPANSE_CONF reserve): a size, a "
                     "fraction of the capacity, or free")
      ->type_name("SPEC");
  stress->add_flag("--neighbour", sa.neighbour,
                   "Sim: another process takes every free byte after each cuMemRelease; with "
                   "--reserve, the run is made again with one-page reserved handles");
  stress->add_flag("--pinned", sa.pinned,
                   "Fragment a pool of pinned host memory instead and ask for one contiguous "
                   "pinned buffer (--capacity: the host memory, 2GiB by default; --size: the "
                   "buffer, 2/5 of it)");
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
  replay_cmd->add_option("--repeat", ra.repeat,
                         "Replay the trace N times back to back on the same allocator, freeing "
                         "what each pass leaves live (default 1)")
      ->type_name("N")
      ->check(CLI::Range(1, 1000));
  replay_cmd->add_option("--host", ra.host,
                         "How the host issues the trace: torch (default: PyTorch's native "
                         "allocator path, backward passes on a second thread, thread caches, the "
                         "GPU running behind), plain (one thread, no thread caches, the GPU "
                         "keeping up), or keys over torch: gpu_lag=N,threads=1|2,"
                         "thread_caches=on|off,stream=null|legacy")
      ->type_name("MODEL");
  replay_cmd->add_flag("--json", ra.json, "Print one JSON object");
  replay_cmd->add_flag("--compare", ra.compare,
                       "Also run models of PyTorch's caching allocator (plain and with "
                       "expandable_segments:True) and compare them with expanse");
  replay_cmd->add_option("--plot", ra.plot,
                         "Write memory over the trace (live, PyTorch recorded and modelled, "
                         "expandable segments, expanse) as an SVG picture (implies --compare)")
      ->type_name("FILE.svg");
  replay_cmd->add_option("--torch-conf", ra.torch_conf,
                         "PyTorch allocator settings for the models, PYTORCH_CUDA_ALLOC_CONF "
                         "syntax (default: the snapshot's allocator_settings, else PyTorch's "
                         "defaults; implies --compare)")
      ->type_name("CONF");
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
  } catch (const trace::input_error& e) {
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
