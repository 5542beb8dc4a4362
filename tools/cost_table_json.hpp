// The JSON form of a measured cost table: what `expanse selftest` writes (its "cost_table"
// object) and what `--cost-table FILE` reads.
//
//   {
//     "cuMemCreate": [{"bytes": 2097152, "seconds": 2.8e-05}, ...],   one per handle size
//     ...                                                              any entry point name
//     "ranges": [{"entry_point": "cuMemUnmap", "mappings": 8,          one call over 8 adjacent
//                 "mapping_bytes": 2097152, "seconds": 9.1e-05}, ...]  mappings of that size
//   }
//
// A file may also hold a whole `expanse selftest --json` report: its "cost_table" is read.
// Entry points the file leaves out keep the built-in (H100) figures.
#pragma once

#include "driver/driver.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace expanse::tools {

// Measured curves, in the units of the JSON (bytes, seconds per call).
struct CostTableSamples {
  struct Point {
    double x = 0;  // bytes per handle, or mappings in one call
    double seconds = 0;
  };
  std::map<driver::EntryPoint, std::vector<Point>> by_bytes;
  std::map<driver::EntryPoint, std::vector<Point>> by_mappings;
  double mapping_bytes = 0;  // size of each mapping in the range measurements
};

nlohmann::ordered_json cost_table_json(const CostTableSamples& t);

// Parses a cost table (or a selftest report holding one). Throws expanse::usage_error naming
// `where` (the file) and the key / index / field at fault.
CostTableSamples parse_cost_table(const nlohmann::json& j, const std::string& where);

// The built-in default with the measured curves in place of its own.
driver::CostModel cost_model_from(const CostTableSamples& t);

// Reads FILE, parses it and installs the result as the process-wide cost model
// (driver::CostModel::set_default) for the allocator's stats and the sim. Throws
// expanse::usage_error for an unreadable or malformed file.
void install_cost_table_file(const std::string& path);

}  // namespace expanse::tools
