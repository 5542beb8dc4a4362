// `expanse info`: the driver in use and why, the devices, and the effective configuration.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace expanse::tools {

// Everything `expanse info` reports, as one JSON object. conf: the EXPANSE_CONF text.
// Throws expanse::usage_error for a bad EXPANSE_CONF, expanse::driver_failure when no driver
// loads.
nlohmann::ordered_json gather_info(const std::string& conf);

// The same as text, for a terminal.
std::string format_info(const nlohmann::ordered_json& info);

}  // namespace expanse::tools
