// A training run whose steps vary in shape (workloads/transformer_steps.hpp: a GPT-2-like model,
// a random batch of random-length sequences each step, backward on a second thread) replayed on
// expanse (the sim, with the replay's host model: the GPU running behind) beside the model of
// PyTorch's expandable segments, step by step: driver calls and modeled driver time of each step,
// and the peak of physical memory (expanse) and of reserved memory (expandable segments) so far.
//
//   build/bin/expanse_bench_varying_steps [STEPS [SEED [KEY=VALUE ...]]]   (30 steps, seed 1)
//
// KEY=VALUE sets the model and the range of shapes: layers, width, heads, vocab, positions,
// min_batch, max_batch, min_length, max_length; batch=N and length=N fix one (a run of one shape
// shows settling on a repeated workload: from its second step, no driver call).
//
// EXPANSE_BENCH_HOST sets the replay's host model (expanse replay --host: torch, plain, ...).
// EXPANSE_BENCH_DETAIL=1 adds, under each step where expanse made driver calls, the calls by entry
// point.
//
// Prints one row per step and a summary: the steps from the 10th on where expanse made more
// driver calls than expandable segments, and the most expanse's peak exceeded theirs.
#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "driver/driver.hpp"
#include "models/torch_model_run.hpp"
#include "replay/replay.hpp"
#include "trace/torch_settings.hpp"
#include "workloads/transformer_steps.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace expanse;

namespace {

// Sets one KEY=VALUE of the shape; false (with a message) for an unknown key or a bad value.
bool set_shape(replay::TransformerSteps& s, const char* arg) {
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
  else {
    std::fprintf(stderr, "expanse_bench_varying_steps: unknown key '%s' (layers, width, heads, "
                 "vocab, positions, batch, length, min_batch, max_batch, min_length, "
                 "max_length)\n", k.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  replay::TransformerSteps shape;
  if (argc > 1) shape.steps = std::atoi(argv[1]);
  if (argc > 2) shape.seed = std::strtoull(argv[2], nullptr, 10);
  for (int i = 3; i < argc; ++i) {
    if (!set_shape(shape, argv[i])) return 2;
  }
  if (shape.min_batch > shape.max_batch || shape.min_length > shape.max_length ||
      shape.max_length > shape.positions) {
    std::fprintf(stderr, "expanse_bench_varying_steps: need min_batch <= max_batch, "
                 "min_length <= max_length <= positions\n");
    return 2;
  }
  const replay::TransformerRun run = replay::transformer_steps(shape);
  const uint64_t capacity = uint64_t{80} << 30;

  trace::TorchSettings es;
  es.expandable_segments = true;
  replay::TorchRunOptions to;
  to.capacity = capacity;
  to.record_events = false;
  to.marks = run.step_ends;
  const replay::TorchRun model = replay::run_torch_model(run.trace, es, to);

  replay::ReplayOptions ro;
  ro.marks = run.step_ends;
  if (const char* h = std::getenv("EXPANSE_BENCH_HOST")) ro.host = replay::parse_host_model(h);
  const replay::ReplayResult ex =
      replay::replay_trace(run.trace, conf::parse_config(conf::from_environment()), capacity, ro);

  const double GiB = 1024.0 * 1024.0 * 1024.0;
  std::printf("%d steps of a GPT-2-like model (seed %llu), %s\n", shape.steps,
              static_cast<unsigned long long>(shape.seed), ex.host.describe().c_str());
  std::printf("%5s %9s | %22s %10s | %22s %10s\n", "step", "tokens", "expandable calls (s)",
              "peak GiB", "expanse calls (s)", "peak GiB");
  const bool detail = std::getenv("EXPANSE_BENCH_DETAIL") != nullptr;
  uint64_t worse_calls = 0;
  double worst_peak = -1e30;
  for (size_t i = 0; i < run.step_ends.size() && i < ex.marks.size() && i < model.marks.size();
       ++i) {
    const auto& m = model.marks[i];
    const auto& x = ex.marks[i];
    const uint64_t m_calls = m.driver_calls_total - (i ? model.marks[i - 1].driver_calls_total : 0);
    const double m_s = m.modeled_driver_seconds - (i ? model.marks[i - 1].modeled_driver_seconds : 0);
    const uint64_t x_calls = x.driver_calls_total - (i ? ex.marks[i - 1].driver_calls_total : 0);
    const double x_s = x.modeled_driver_seconds - (i ? ex.marks[i - 1].modeled_driver_seconds : 0);
    std::printf("%5zu %4llux%-4llu | %12llu (%7.4f) %10.3f | %12llu (%7.4f) %10.3f\n", i + 1,
                static_cast<unsigned long long>(run.batch[i]),
                static_cast<unsigned long long>(run.length[i]),
                static_cast<unsigned long long>(m_calls), m_s, static_cast<double>(m.peak_reserved) / GiB,
                static_cast<unsigned long long>(x_calls), x_s, static_cast<double>(x.peak_physical_bytes) / GiB);
    if (detail && x_calls != 0) {  // expanse's calls in this step, by entry point
      std::printf("      ");
      for (size_t e = 0; e < x.driver_calls.size(); ++e) {
        const uint64_t d = x.driver_calls[e] - (i ? ex.marks[i - 1].driver_calls[e] : 0);
        if (d == 0) continue;
        std::printf(" %s %llu", driver::entry_point_name(static_cast<driver::EntryPoint>(e)),
                    static_cast<unsigned long long>(d));
      }
      std::printf("\n");
    }
    if (i + 1 >= 10) {
      if (x_calls > m_calls) ++worse_calls;
      worst_peak = std::max(worst_peak, (static_cast<double>(x.peak_physical_bytes) -
                                         static_cast<double>(m.peak_reserved)) /
                                            (1024.0 * 1024.0));
    }
  }
  if (shape.steps >= 10) {
    std::printf("from step 10: %llu steps with more driver calls than expandable segments; "
                "expanse's peak at most %.0f MiB above theirs\n",
                static_cast<unsigned long long>(worse_calls), worst_peak);
  }
  std::printf("whole run: expandable %llu calls %.3f s, expanse %llu calls %.3f s\n",
              static_cast<unsigned long long>(model.driver_calls_total),
              model.modeled_driver_seconds,
              static_cast<unsigned long long>(ex.passes[0].driver_calls_total),
              ex.passes[0].modeled_driver_seconds);
  return 0;
}
