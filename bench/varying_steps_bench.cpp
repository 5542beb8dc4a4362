// A training run whose steps vary in shape (workloads/transformer_steps.hpp: a GPT-2-like model,
// a random batch of random-length sequences each step, backward on a second thread) replayed on
// expanse (the sim, with the replay's host model: the GPU running behind) beside the model of
// PyTorch's expandable segments, step by step: driver calls and modeled driver time of each step,
// and the peak of physical memory (expanse) and of reserved memory (expandable segments) so far.
//
//   build/bin/expanse_bench_varying_steps [STEPS [SEED]]   (default 30 steps, seed 1)
//
// EXPANSE_BENCH_HOST sets the replay's host model (expanse replay --host: torch, plain, ...).
//
// Prints one row per step and a summary: the steps from the 10th on where expanse made more
// driver calls than expandable segments, and the most expanse's peak exceeded theirs.
#include "conf/config.hpp"
#include "conf/env_config.hpp"
#include "models/torch_model_run.hpp"
#include "replay/replay.hpp"
#include "trace/torch_settings.hpp"
#include "workloads/transformer_steps.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace expanse;

int main(int argc, char** argv) {
  replay::TransformerSteps shape;
  if (argc > 1) shape.steps = std::atoi(argv[1]);
  if (argc > 2) shape.seed = std::strtoull(argv[2], nullptr, 10);
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
    if (i + 1 >= 10) {
      if (x_calls > m_calls) ++worse_calls;
      worst_peak = std::max(worst_peak, (static_cast<double>(x.peak_physical_bytes) -
                                         static_cast<double>(m.peak_reserved)) /
                                            (1024.0 * 1024.0));
    }
  }
  std::printf("from step 10: %llu steps with more driver calls than expandable segments; expanse's "
              "peak at most %.0f MiB above theirs\n",
              static_cast<unsigned long long>(worse_calls), worst_peak);
  std::printf("whole run: expandable %llu calls %.3f s, expanse %llu calls %.3f s\n",
              static_cast<unsigned long long>(model.driver_calls_total),
              model.modeled_driver_seconds,
              static_cast<unsigned long long>(ex.passes[0].driver_calls_total),
              ex.passes[0].modeled_driver_seconds);
  return 0;
}
