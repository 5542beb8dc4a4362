// A training run whose steps vary in shape (workloads/transformer_steps.hpp: a GPT-2-like model,
// a random batch of random-length sequences each step, backward on a second thread) replayed on
// expanse (the sim, with the replay's host model: the GPU running behind) beside the model of
// PyTorch's expandable segments, and judged as docs/design.md promises ("Settling once"):
// - from the 10th step, no cuMemUnmap, no cuMemRelease, pages created, mapped and granted only
//   above expanse's own earlier peak, and no more of any other call than expandable segments
//   make in that step;
// - the whole run's modeled driver time within max(1.25 x expandable segments, the one-page
//   floor) + 10 ms (report/settling.hpp);
// - expanse's peak physical memory at most expandable segments' peak reserved + 64 MiB at the
//   end of every step.
//
//   build/bin/expanse_bench_varying_steps [STEPS [SEEDS [KEY=VALUE ...]]] [--cost-table FILE]
//
// STEPS: steps per run (30). SEEDS: one seed (1), printed step by step, or FIRST-LAST, one line
// per run and a tally. KEY=VALUE sets the model and the range of shapes: layers, width, heads,
// vocab, positions, min_batch, max_batch, min_length, max_length; batch=N and length=N fix one
// (a run of one shape repeats: from its third step, no driver call); capacity_gib=N the device
// (80). --cost-table FILE (an `expanse selftest` report or cost table) runs every seed again
// priced by that table and prints its figures beside; the bounds are judged on the default table.
//
// EXPANSE_BENCH_HOST sets the replay's host model (expanse replay --host: torch, plain, ...).
// EXPANSE_BENCH_DETAIL=1 adds, under each step where expanse made driver calls, the calls by entry
// point. Exit status 0 when every run holds all three, 1 when one does not, 2 on bad arguments.
#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "cost_table_json.hpp"
#include "driver/driver.hpp"
#include "driver_api/cost_model.hpp"
#include "replay/replay.hpp"
#include "report/driver_floor.hpp"
#include "report/settling.hpp"
#include "workloads/transformer_steps.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

using namespace expanse;

namespace {

constexpr size_t kFirstJudgedStep = 10;
constexpr double MiB = 1024.0 * 1024.0;
constexpr double GiB = 1024.0 * MiB;
constexpr int64_t kPeakSlack = 64 << 20;

// Sets one KEY=VALUE of the shape; false (with a message) for an unknown key or a bad value.
bool set_shape(replay::TransformerSteps& s, uint64_t& capacity, const char* arg) {
  const char* eq = std::strchr(arg, '=');
  char* end = nullptr;
  const uint64_t v = eq != nullptr ? std::strtoull(eq + 1, &end, 10) : 0;
  if (eq == nullptr || end == eq + 1 || *end != '\0' || v == 0) {
    std::fprintf(stderr, "expanse_bench_varying_steps: '%s': expected KEY=N with N > 0\n", arg);
    return false;
  }
  const std::string k(arg, eq);
  if (k == "layers") s.layers = static_cast<int>(v);
  else if (k == "width") s.width = v;
  else if (k == "heads") s.heads = v;
  else if (k == "vocab") s.vocab = v;
  else if (k == "positions") s.positions = v;
  else if (k == "batch") s.min_batch = s.max_batch = v;
  else if (k == "length") s.min_length = s.max_length = v;
  else if (k == "min_batch") s.min_batch = v;
  else if (k == "max_batch") s.max_batch = v;
  else if (k == "min_length") s.min_length = v;
  else if (k == "max_length") s.max_length = v;
  else if (k == "capacity_gib") capacity = v << 30;
  else {
    std::fprintf(stderr, "expanse_bench_varying_steps: unknown key '%s' (layers, width, heads, "
                 "vocab, positions, batch, length, min_batch, max_batch, min_length, "
                 "max_length, capacity_gib)\n", k.c_str());
    return false;
  }
  return true;
}

// "FIRST-LAST" or "N"; false for anything else.
bool parse_seeds(const char* arg, uint64_t* first, uint64_t* last) {
  char* end = nullptr;
  *first = std::strtoull(arg, &end, 10);
  if (end == arg) return false;
  *last = *first;
  if (*end == '-') {
    const char* b = end + 1;
    *last = std::strtoull(b, &end, 10);
    if (end == b) return false;
  }
  return *end == '\0' && *first <= *last;
}

bool holds(const replay::SteppedRun& r) {
  return r.steps_breaking() == 0 && r.seconds() <= r.bound &&
         r.worst_peak_excess() <= kPeakSlack && r.expanse.ooms == 0;
}

void print_steps(const replay::TransformerRun& run, const replay::SteppedRun& r, bool detail) {
  std::printf("%5s %9s | %22s %10s | %22s %10s | %s\n", "step", "tokens", "expandable calls (s)",
              "peak GiB", "expanse calls (s)", "peak GiB", "from step 10: what breaks settling");
  const auto& xm = r.expanse.marks;
  const auto& mm = r.model.marks;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const uint64_t m_calls = mm[i].driver_calls_total - (i ? mm[i - 1].driver_calls_total : 0);
    const double m_s = mm[i].modeled_driver_seconds - (i ? mm[i - 1].modeled_driver_seconds : 0);
    const uint64_t x_calls = xm[i].driver_calls_total - (i ? xm[i - 1].driver_calls_total : 0);
    const double x_s = xm[i].modeled_driver_seconds - (i ? xm[i - 1].modeled_driver_seconds : 0);
    std::printf("%5zu %4llux%-4llu | %12llu (%7.4f) %10.3f | %12llu (%7.4f) %10.3f | %s\n", i + 1,
                static_cast<unsigned long long>(run.batch[i]),
                static_cast<unsigned long long>(run.length[i]),
                static_cast<unsigned long long>(m_calls), m_s,
                static_cast<double>(r.model_peak[i]) / GiB,
                static_cast<unsigned long long>(x_calls), x_s,
                static_cast<double>(r.peak[i]) / GiB, r.breaks[i].c_str());
    if (detail && x_calls != 0) {  // expanse's calls in this step, by entry point
      std::printf("      ");
      for (size_t e = 0; e < r.steps[i].calls.size(); ++e) {
        if (r.steps[i].calls[e] == 0) continue;
        std::printf(" %s %llu", driver::entry_point_name(static_cast<driver::EntryPoint>(e)),
                    static_cast<unsigned long long>(r.steps[i].calls[e]));
      }
      std::printf("\n");
    }
  }
}

// One line: the three judgements of a run.
void print_verdict(uint64_t seed, const replay::SteppedRun& r) {
  size_t worst_step = 0;
  const int64_t excess = r.worst_peak_excess(&worst_step);
  size_t first_break = 0;
  for (size_t i = 0; i < r.breaks.size() && first_break == 0; ++i) {
    if (!r.breaks[i].empty()) first_break = i + 1;
  }
  std::printf("seed %llu: %s | from step %zu: %zu steps break settling%s | peak %+.0f MiB vs "
              "expandable (step %zu)%s | created pages %.3f x peak | whole run %.3f s, bound "
              "%.3f s = max(1.25 x expandable %.3f, one-page floor %.3f) + 10 ms (%.2f)%s\n",
              static_cast<unsigned long long>(seed), holds(r) ? "holds" : "BREAKS",
              kFirstJudgedStep, r.steps_breaking(),
              first_break != 0 ? (" (first: step " + std::to_string(first_break) + ", " +
                                  r.breaks[first_break - 1] + ")").c_str()
                               : "",
              static_cast<double>(excess) / MiB, worst_step,
              excess > kPeakSlack ? " OVER +64 MiB" : "", r.created_ratio(), r.seconds(), r.bound,
              r.model.modeled_driver_seconds, r.one_page_floor, r.seconds() / r.bound,
              r.expanse.ooms != 0 ? " | OOM" : "");
}

}  // namespace

int main(int argc, char** argv) {
  replay::TransformerSteps shape;
  uint64_t first_seed = 1, last_seed = 1;
  uint64_t capacity = uint64_t{80} << 30;
  std::string cost_table;
  std::vector<const char*> positional;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cost-table") == 0) {
      if (i + 1 == argc) {
        std::fprintf(stderr, "expanse_bench_varying_steps: --cost-table needs a FILE\n");
        return 2;
      }
      cost_table = argv[++i];
    } else {
      positional.push_back(argv[i]);
    }
  }
  if (!positional.empty()) shape.steps = std::atoi(positional[0]);
  if (positional.size() > 1 && !parse_seeds(positional[1], &first_seed, &last_seed)) {
    std::fprintf(stderr, "expanse_bench_varying_steps: SEEDS '%s': expected N or FIRST-LAST\n",
                 positional[1]);
    return 2;
  }
  for (size_t i = 2; i < positional.size(); ++i) {
    if (!set_shape(shape, capacity, positional[i])) return 2;
  }
  if (shape.steps <= 0 || shape.min_batch > shape.max_batch ||
      shape.min_length > shape.max_length || shape.max_length > shape.positions) {
    std::fprintf(stderr, "expanse_bench_varying_steps: need STEPS > 0, min_batch <= max_batch, "
                 "min_length <= max_length <= positions\n");
    return 2;
  }
  replay::HostModel host = replay::default_host_model();
  try {
    if (const char* h = std::getenv("EXPANSE_BENCH_HOST")) host = replay::parse_host_model(h);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_bench_varying_steps: EXPANSE_BENCH_HOST: %s\n", e.what());
    return 2;
  }
  const conf::Config conf = conf::parse_config(conf::from_environment());
  const bool one = first_seed == last_seed;
  const bool detail = std::getenv("EXPANSE_BENCH_DETAIL") != nullptr;

  std::printf("%d steps of a GPT-2-like model (%d layers, width %llu, batch %llu-%llu, length "
              "%llu-%llu) on a %.0f GiB device, %s, seeds %llu-%llu\n",
              shape.steps, shape.layers, static_cast<unsigned long long>(shape.width),
              static_cast<unsigned long long>(shape.min_batch),
              static_cast<unsigned long long>(shape.max_batch),
              static_cast<unsigned long long>(shape.min_length),
              static_cast<unsigned long long>(shape.max_length),
              static_cast<double>(capacity) / GiB, host.describe().c_str(),
              static_cast<unsigned long long>(first_seed),
              static_cast<unsigned long long>(last_seed));
  struct Priced {
    double expanse = 0, model = 0, floor = 0;
  };
  std::vector<Priced> on_default;
  size_t held = 0;
  for (uint64_t seed = first_seed; seed <= last_seed; ++seed) {
    shape.seed = seed;
    const replay::TransformerRun run = replay::transformer_steps(shape);
    const replay::SteppedRun r =
        replay::run_steps(run.trace, run.step_ends, conf, capacity, host, kFirstJudgedStep);
    if (one) print_steps(run, r, detail);
    print_verdict(seed, r);
    held += holds(r) ? 1 : 0;
    on_default.push_back({r.seconds(), r.model.modeled_driver_seconds, r.one_page_floor});
  }
  std::printf("%zu of %llu runs hold all three (settled from step %zu, whole run within its "
              "bound, peak at most expandable segments' + 64 MiB at every step)\n",
              held, static_cast<unsigned long long>(last_seed - first_seed + 1),
              kFirstJudgedStep);
  if (!cost_table.empty()) {
    try {
      tools::install_cost_table_file(cost_table);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "expanse_bench_varying_steps: %s\n", e.what());
      return 2;
    }
    std::printf("priced by %s (the allocator's choices priced by it too), beside the default "
                "table:\n", cost_table.c_str());
    std::printf("%6s | %10s %10s %10s | %10s %10s %10s\n", "seed", "expanse s", "expandable",
                "floor", "default:", "expandable", "floor");
    for (uint64_t seed = first_seed; seed <= last_seed; ++seed) {
      shape.seed = seed;
      const replay::TransformerRun run = replay::transformer_steps(shape);
      const replay::SteppedRun r =
          replay::run_steps(run.trace, run.step_ends, conf, capacity, host, kFirstJudgedStep);
      const Priced& d = on_default[seed - first_seed];
      std::printf("%6llu | %10.3f %10.3f %10.3f | %10.3f %10.3f %10.3f\n",
                  static_cast<unsigned long long>(seed), r.seconds(),
                  r.model.modeled_driver_seconds, r.one_page_floor, d.expanse, d.model, d.floor);
    }
  }
  return held == last_seed - first_seed + 1 ? 0 : 1;
}
