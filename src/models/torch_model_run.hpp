// Runs a trace through the models of PyTorch's caching allocator (torch_caching_model.hpp):
// from the state PyTorch's allocator was in when recording began (reconstructed from the
// snapshot's end state and segment events) or from an empty device; checks a run against what
// PyTorch recorded; and searches the smallest device on which a model runs the trace.
#pragma once

#include "models/torch_caching_model.hpp"
#include "trace/trace.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace expanse::replay {

// The caching allocator's segments when recording began, with the blocks then live.
struct TorchStartState {
  struct Segment {
    uint64_t addr = 0;
    uint64_t size = 0;
    uint64_t stream = 0;
    bool small = false;
    std::vector<TorchCachingModel::LiveBlock> live;  // by address
  };
  std::vector<Segment> segments;
  uint64_t reserved = 0;
};

// Reconstructs it: the end segments, with the recorded segment_alloc undone and segment_free
// redone, holding the blocks allocated before recording (live ones at their recorded size, freed
// ones at the rounded size of their request). nullopt with `why` when that cannot be done
// (no recording, expandable segments, CUDA graph pools, a block outside every segment).
std::optional<TorchStartState> torch_start_state(const trace::Trace& t,
                                                 const trace::TorchSettings& s, std::string* why);

struct TorchRunOptions {
  uint64_t capacity = uint64_t{1} << 62;  // device bytes (default: no limit)
  // null: an empty device, preexisting blocks malloc'd. Wholly free start segments that do
  // not fit the capacity are left out (PyTorch would have released them before failing).
  const TorchStartState* start = nullptr;
  bool stop_at_first_oom = false;
  bool record_reserved = false;  // reserved_after_op
  bool record_events = true;     // segment_events
  // Hand new cudaMalloc segments the addresses the recording gave segments of their size (in
  // recorded order), so that best fit breaks ties between equal blocks as the real one did.
  bool recorded_addresses = false;
  // Make the releases inferred from the recording (trace::Trace::releases): empty_cache() calls
  // and free-and-retries, which the trace's operations alone do not cause on an unbounded
  // device.
  bool inferred_releases = true;
  // Operations (ascending) after which the run's figures are kept (TorchRun::marks).
  std::vector<uint64_t> marks;
};

// A model run's figures after one of TorchRunOptions::marks.
struct TorchMark {
  uint64_t op = 0;
  uint64_t driver_calls_total = 0;  // since the run began
  double modeled_driver_seconds = 0;
  uint64_t reserved = 0;       // now
  uint64_t peak_reserved = 0;  // the most so far
  std::map<std::string, uint64_t> driver_calls;  // since the run began, by entry point name
};

struct TorchRun {
  uint64_t capacity = 0;
  uint64_t ops_done = 0;
  uint64_t peak_reserved = 0;
  uint64_t ooms = 0;
  std::optional<TorchOom> first_oom;
  uint64_t driver_calls_total = 0;
  double modeled_driver_seconds = 0;
  std::map<std::string, uint64_t> driver_calls;
  std::vector<uint64_t> reserved_after_op;
  std::vector<TorchSegmentEvent> segment_events;
  std::vector<TorchMark> marks;
  bool start_failed = false;  // the start state did not fit `capacity`: an OOM at op 0
};

TorchRun run_torch_model(const trace::Trace& t, const trace::TorchSettings& s,
                         const TorchRunOptions& o);

// A model run checked against the recording.
struct TorchAgreement {
  uint64_t recorded_events = 0;    // recorded segment events (alloc/free/map/unmap)
  uint64_t reproduced_events = 0;  // of them, the model made the same (action, size) in order
                                   // during the same operation
  uint64_t model_events = 0;
  std::optional<uint64_t> first_difference_op;  // the first operation where they differ
  uint64_t recorded_peak_reserved = 0;
  uint64_t model_peak_reserved = 0;
  bool from_recorded_state = false;  // started from torch_start_state (else an empty device)
  // Why the recording may not be reproducible by a deterministic replay of this trace.
  std::vector<std::string> caveats;
  double peak_error() const noexcept;  // |model - recorded| / recorded
};

TorchAgreement check_torch_model(const trace::Trace& t, const trace::TorchSettings& s);

// The smallest capacity, in 2 MiB steps, on which the model runs the trace with no OOM (a binary
// search between the peak of live bytes and the model's unconstrained peak reserved; assumes a
// larger device never fails where a smaller one succeeded).
struct TorchMinCapacity {
  uint64_t bytes = 0;
  int probes = 0;
};
// `base` gives the start state and address choice; its capacity and recording flags are ignored.
TorchMinCapacity torch_min_capacity(const trace::Trace& t, const trace::TorchSettings& s,
                                    const TorchRunOptions& base, uint64_t unconstrained_peak);

}  // namespace expanse::replay
