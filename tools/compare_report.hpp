// `expanse replay --compare`: its JSON object ("compare") and its text table.
#pragma once

#include "report/compare.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace expanse::tools {

nlohmann::ordered_json compare_json(const replay::CompareReport& c);
std::string compare_text(const replay::CompareReport& c, uint64_t peak_live);

}  // namespace expanse::tools
