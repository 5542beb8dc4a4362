// One replay run as the CLI reports it: read a trace, replay it on a sim device, optionally find
// the smallest device it fits. The data only; formatting (JSON, text) is the CLI's.
#pragma once

#include "conf/config.hpp"
#include "replay/replay.hpp"
#include "trace/trace.hpp"

#include <functional>
#include <optional>
#include <string>

namespace expanse::replay {

struct ReplayRequest {
  std::string path;
  int device = -1;        // snapshot device (-1: the one with the most allocations)
  conf::Config conf;       // allocator and sim options
  size_t capacity = 0;    // device bytes, a multiple of replay_granularity(conf)
  bool min_capacity = false;
  int repeat = 1;  // passes of the replay at `capacity` (the min-capacity search runs one)
  HostModel host = default_host_model();  // how the operations are issued
};

struct ReplayReport {
  trace::Trace trace;
  ReplayResult replay;
  std::optional<MinCapacity> min_capacity;
  double load_seconds = 0;
  double wall_seconds = 0;
};

// fraction of the whole run in [0, 1], and what is running ("replay", "min-capacity: replay 2/9").
using ReportProgress = std::function<void(double fraction, const std::string& label)>;

// Reads, replays and searches as the request asks. Throws trace::input_error (bad trace) and the
// allocator's errors.
ReplayReport make_replay_report(const ReplayRequest& req, const ReportProgress& progress = {});

}  // namespace expanse::replay
