// Whether a run settles as docs/design.md promises ("Settling once"): in a step judged settled
// (from the 10th step of a run whose shapes vary; every pass after the first of a trace replayed
// with --repeat) expanse makes no cuMemUnmap and no cuMemRelease, creates, maps and grants only
// pages above its own earlier peak of physical memory (each at most once), and makes no more of
// any other call than the model of PyTorch's expandable segments makes in that step. And the
// bounds on what paying for invariant 1 once may cost, by kind of workload.
#pragma once

#include "driver_api/entry_points.hpp"
#include "models/torch_model_run.hpp"
#include "replay/replay.hpp"
#include "trace/trace.hpp"
#include "conf/config.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace expanse::replay {

// One step of a run: what expanse did in it, beside what the model of expandable segments did.
struct StepCalls {
  std::array<uint64_t, driver::kEntryPointCount> calls{};  // expanse's, per entry point
  uint64_t created_pages = 0;                              // expanse's, in the step
  uint64_t peak_physical_before = 0;  // expanse's peak physical bytes before the step
  uint64_t peak_physical_after = 0;   // and at its end
  std::map<std::string, uint64_t> model_calls;  // the model's, by entry point name
};

// The steps between consecutive marks (both runs marked after the same operations; the first
// step starts from nothing). The shorter of the two mark lists decides how many.
std::vector<StepCalls> steps_between_marks(const std::vector<ReplayMark>& expanse,
                                           const std::vector<TorchMark>& model);

// "" when a settled step keeps the promise; otherwise each thing it broke, "; "-separated, with
// its count (and the model's, for calls the model also makes). page: the allocator's page.
// Synchronizations (stream, event, context) count as one kind, as the model's
// cuStreamSynchronize does.
std::string settled_step_breaks(const StepCalls& s, uint64_t page);

// What paying for invariant 1 once may cost at most (modeled driver seconds), by kind of
// workload. One whose shapes vary (block boundaries move from step to step): max(1.25 x the
// expandable-segments model, the one-page floor) + 10 ms, for a whole generated run or a trace's
// first pass. One that repeats its shapes: max(1.25 x the model, 1.25 x the live-set floor)
// + 10 ms for its first pass.
double varying_driver_bound(double model_seconds, double one_page_floor_seconds);
double repeated_driver_bound(double model_seconds, double live_set_floor_seconds);

// A run of steps replayed on expanse (a sim device, the host model `host`) beside the model of
// expandable segments, and judged.
struct SteppedRun {
  ReplayResult expanse;  // marked after every step
  TorchRun model;        // the same
  std::vector<StepCalls> steps;
  // Per step, the peaks so far: expanse's physical bytes, the model's reserved bytes.
  std::vector<uint64_t> peak, model_peak;
  std::vector<std::string> breaks;  // per step: settled_step_breaks ("" for steps not judged)
  uint64_t page = 0;
  double one_page_floor = 0;  // seconds (one_page_driver_floor of the trace's peak live)
  double bound = 0;           // varying_driver_bound of the whole run
  uint64_t peak_pages = 0;    // expanse's peak physical, in pages

  size_t steps_breaking() const;   // judged steps with something broken
  // The most expanse's peak so far exceeds the model's at the end of any step (bytes; negative
  // when below at every step), and the first step where it does so by the most.
  int64_t worst_peak_excess(size_t* step = nullptr) const;
  double seconds() const { return expanse.passes.empty() ? 0 : expanse.passes[0].modeled_driver_seconds; }
  double created_ratio() const;  // pages created over the peak pages
};

// Replays t (steps ending after step_ends, ascending) both ways on a device of `capacity` bytes
// and judges every step from `first_judged` (1-based) on.
SteppedRun run_steps(const trace::Trace& t, const std::vector<uint64_t>& step_ends,
                     const conf::Config& conf, uint64_t capacity, const HostModel& host,
                     size_t first_judged);

}  // namespace expanse::replay
