// The CLI's reports: one JSON object per command (--json) or text for a terminal.
#pragma once

#include "replay.hpp"
#include "stress.hpp"
#include "trace.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace expanse::tools {

// One count per driver entry point, by its CUDA name ("cuMemMap": 12, ...).
nlohmann::ordered_json driver_calls_json(const core::DeviceStats& s);

struct ReplayReport {
  const Trace* trace = nullptr;
  ReplayResult replay;
  std::optional<MinCapacity> min_capacity;
  double load_seconds = 0;
  double wall_seconds = 0;
};

nlohmann::ordered_json replay_json(const ReplayReport& r);
std::string replay_text(const ReplayReport& r);

nlohmann::ordered_json stress_json(const StressResult& r);
std::string stress_text(const StressResult& r);

}  // namespace expanse::tools
