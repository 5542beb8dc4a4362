#include "cost_table_json.hpp"

#include "expanse/errors.hpp"

#include <fstream>
#include <optional>
#include <sstream>

namespace expanse::tools {
namespace {

using driver::EntryPoint;
using Json = nlohmann::json;

constexpr double kNsPerSecond = 1e9;

std::optional<EntryPoint> entry_point_named(const std::string& name) {
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<EntryPoint>(i);
    if (name == driver::entry_point_name(e)) return e;
  }
  return std::nullopt;
}

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw usage_error(where + ": " + what);
}

// A number >= lo in field `key` of object o; `at` says where o is, for the message.
double number(const Json& o, const char* key, double lo, const std::string& at) {
  auto it = o.find(key);
  if (it == o.end()) throw usage_error(at + ": missing \"" + key + "\"");
  if (!it->is_number()) throw usage_error(at + ": \"" + key + "\" is not a number");
  const double v = it->get<double>();
  if (!(v >= lo)) {
    std::ostringstream m;
    m << at << ": \"" << key << "\" is " << v << ", must be >= " << lo;
    throw usage_error(m.str());
  }
  return v;
}

}  // namespace

nlohmann::ordered_json cost_table_json(const CostTableSamples& t) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [e, points] : t.by_bytes) {
    auto& arr = out[driver::entry_point_name(e)] = nlohmann::ordered_json::array();
    for (const auto& p : points) arr.push_back({{"bytes", p.x}, {"seconds", p.seconds}});
  }
  auto& ranges = out["ranges"] = nlohmann::ordered_json::array();
  for (const auto& [e, points] : t.by_mappings) {
    for (const auto& p : points) {
      ranges.push_back({{"entry_point", driver::entry_point_name(e)},
                        {"mappings", p.x},
                        {"mapping_bytes", t.mapping_bytes},
                        {"seconds", p.seconds}});
    }
  }
  return out;
}

CostTableSamples parse_cost_table(const Json& whole, const std::string& where) {
  const Json* j = &whole;
  if (whole.is_object() && whole.contains("cost_table")) j = &whole["cost_table"];
  if (!j->is_object()) bad(where, "a cost table is a JSON object (entry point name -> samples)");
  CostTableSamples t;
  for (const auto& [key, value] : j->items()) {
    if (key == "ranges") {
      if (!value.is_array()) bad(where, "\"ranges\" is not an array");
      for (size_t i = 0; i < value.size(); ++i) {
        const Json& r = value[i];
        const std::string at = where + ": ranges[" + std::to_string(i) + "]";
        if (!r.is_object()) throw usage_error(at + ": not an object");
        auto ep = r.find("entry_point");
        if (ep == r.end() || !ep->is_string())
          throw usage_error(at + ": missing \"entry_point\" (a name such as \"cuMemUnmap\")");
        const auto e = entry_point_named(ep->get<std::string>());
        if (!e) throw usage_error(at + ": unknown entry point \"" + ep->get<std::string>() + "\"");
        const double mappings = number(r, "mappings", 1, at);
        const double seconds = number(r, "seconds", 0, at);
        if (r.contains("mapping_bytes")) t.mapping_bytes = number(r, "mapping_bytes", 0, at);
        t.by_mappings[*e].push_back({mappings, seconds});
      }
      continue;
    }
    const auto e = entry_point_named(key);
    if (!e) bad(where, "unknown entry point \"" + key + "\" (expected names such as cuMemCreate)");
    if (!value.is_array() || value.empty())
      bad(where, "\"" + key + "\" is not a non-empty array of {bytes, seconds}");
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string at = where + ": " + key + "[" + std::to_string(i) + "]";
      if (!value[i].is_object()) throw usage_error(at + ": not an object");
      t.by_bytes[*e].push_back({number(value[i], "bytes", 0, at),
                                number(value[i], "seconds", 0, at)});
    }
  }
  return t;
}

driver::CostModel cost_model_from(const CostTableSamples& t) {
  driver::CostModel m = driver::CostModel::h100();
  for (const auto& [e, points] : t.by_bytes) {
    std::vector<driver::CostSample> s;
    for (const auto& p : points) s.push_back({p.x, p.seconds * kNsPerSecond});
    m.set_samples(e, std::move(s));
  }
  for (const auto& [e, points] : t.by_mappings) {
    std::vector<driver::CostSample> s;
    for (const auto& p : points) s.push_back({p.x, p.seconds * kNsPerSecond});
    if (t.mapping_bytes > 0) {
      m.set_range_samples(e, std::move(s), t.mapping_bytes);
    } else {
      m.set_range_samples(e, std::move(s));
    }
  }
  return m;
}

void install_cost_table_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw usage_error("--cost-table " + path + ": cannot open the file");
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::parse_error& e) {
    throw usage_error("--cost-table " + path + ": not JSON: " + e.what());
  }
  driver::CostModel::set_default(cost_model_from(parse_cost_table(j, "--cost-table " + path)));
}

}  // namespace expanse::tools
