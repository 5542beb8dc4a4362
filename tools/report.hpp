// The CLI's reports: one JSON object per command (--json) or text for a terminal.
#pragma once

#include "report/replay_report.hpp"
#include "workloads/pinned_stress.hpp"
#include "workloads/stress.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace expanse::tools {

using replay::run_stress;
using replay::StressOptions;
using replay::StressResult;


// One count per driver entry point, by its CUDA name ("cuMemMap": 12, ...).
nlohmann::ordered_json driver_calls_json(const core::DeviceStats& s);

nlohmann::ordered_json replay_json(const replay::ReplayReport& r);
std::string replay_text(const replay::ReplayReport& r);

nlohmann::ordered_json stress_json(const StressResult& r);
std::string stress_text(const StressResult& r);

nlohmann::ordered_json pinned_stress_json(const replay::PinnedStressResult& r);
std::string pinned_stress_text(const replay::PinnedStressResult& r);

}  // namespace expanse::tools
