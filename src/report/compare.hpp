// `expanse replay --compare`: one trace through PyTorch's caching allocator (as recorded, and as
// modelled), the same allocator with expandable segments, and expanse, side by side; where each
// runs out of memory and why. The data only; the CLI formats it.
#pragma once

#include "conf/config.hpp"
#include "report/replay_report.hpp"
#include "models/torch_model_run.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace expanse::replay {

struct CompareRequest {
  // --torch-conf; else the snapshot's, else defaults.
  std::optional<trace::TorchSettings> torch_conf;
  bool min_capacity = false;
  bool series = false;  // memory after every operation, for --plot
};

// The moment an allocation failed and why: fragmentation (capacity - allocated would hold the
// request, but no free block or new segment could) or exhaustion (live memory leaves no room).
struct OomExplanation {
  uint64_t op = 0;  // index into trace::Trace::ops
  uint64_t request_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint64_t device_free_bytes = 0;
  std::optional<uint64_t> largest_free_block_bytes;  // models only
  bool fragmentation = false;
};

struct CompareRow {
  uint64_t peak_reserved_bytes = 0;  // expanse: peak physical memory held (mapped + pooled)
  uint64_t ooms = 0;
  std::optional<uint64_t> first_oom_op;
  std::optional<OomExplanation> first_oom;
  std::string first_oom_message;  // expanse: the allocator's message
  std::optional<uint64_t> min_capacity_bytes;
  uint64_t driver_calls_total = 0;
  double modeled_driver_seconds = 0;
};

struct CompareReport {
  uint64_t capacity = 0;
  trace::TorchSettings settings;
  std::string settings_source;  // "--torch-conf", "the snapshot's allocator_settings", ...
  std::optional<uint64_t> recorded_peak_reserved_bytes;
  std::vector<OomExplanation> recorded_ooms;  // the snapshot's own oom events
  CompareRow pytorch, pytorch_expandable, expanse;
  TorchAgreement agreement;
  // Releases the snapshot does not mark, inferred from its segment events and made in both
  // models (and, for empty_cache() calls, in expanse): trace::Trace::releases.
  struct Inferred {
    uint64_t empty_cache_calls = 0;
    uint64_t free_and_retries = 0;
    uint64_t segment_frees = 0;  // recorded segment_free events they account for
  } inferred;
  double wall_seconds = 0;

  // With CompareRequest::series: bytes after every operation of trace::Trace::ops.
  struct Series {
    std::vector<uint64_t> live;
    std::vector<uint64_t> recorded_reserved;  // empty without a recording
    std::vector<uint64_t> pytorch_reserved;
    std::vector<uint64_t> expandable_reserved;
    std::vector<uint64_t> expanse_mapped;
  } series;
};

// rep: the ordinary replay (trace, expanse on rep.replay.capacity, optional min capacity).
// conf: expanse's options (for the series replay). Throws std::invalid_argument for settings
// the models cannot use.
CompareReport make_compare_report(const ReplayReport& rep, const conf::Config& conf,
                                  const CompareRequest& req);

// "PyTorch needs 56.92 GiB for this workload, expandable segments 53.10 GiB, expanse 51.31 GiB"
std::string compare_headline(const CompareReport& c);

}  // namespace expanse::replay
