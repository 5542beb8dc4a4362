// The cost table's JSON form: what selftest writes reads back into the model the allocator and
// the sim price calls with; bad files are named precisely.
#include "cost_table_json.hpp"

#include "expanse/errors.hpp"

#include <gtest/gtest.h>

namespace expanse::test {
namespace {

using driver::EntryPoint;
using Json = nlohmann::json;
constexpr double MiB = 1024.0 * 1024.0;

tools::CostTableSamples sample_table() {
  tools::CostTableSamples t;
  t.by_bytes[EntryPoint::mem_create] = {{2 * MiB, 30e-6}, {1024 * MiB, 300e-6}};
  t.by_bytes[EntryPoint::mem_map] = {{2 * MiB, 4e-6}};
  t.by_mappings[EntryPoint::mem_unmap] = {{1, 40e-6}, {512, 800e-6}};
  t.mapping_bytes = 2 * MiB;
  return t;
}

TEST(CostTableJson, WhatIsWrittenReadsBackIntoTheModel) {
  const Json j = Json::parse(tools::cost_table_json(sample_table()).dump());
  ASSERT_EQ(j["cuMemCreate"].size(), 2u);
  EXPECT_EQ(j["cuMemCreate"][1]["bytes"].get<double>(), 1024 * MiB);
  EXPECT_EQ(j["ranges"][1]["entry_point"], "cuMemUnmap");
  EXPECT_EQ(j["ranges"][1]["mappings"].get<double>(), 512);

  const tools::CostTableSamples back = tools::parse_cost_table(j, "t.json");
  const driver::CostModel m = tools::cost_model_from(back);
  EXPECT_DOUBLE_EQ(m.cost_ns(EntryPoint::mem_create, size_t{2} << 20), 30e3);
  EXPECT_DOUBLE_EQ(m.cost_ns(EntryPoint::mem_create, size_t{1} << 30), 300e3);
  EXPECT_DOUBLE_EQ(m.cost_ns(EntryPoint::mem_map, size_t{64} << 20), 4e3);  // one sample: flat
  // One call over 512 mappings of 2 MiB: the range curve, not 512 single calls.
  EXPECT_NEAR(m.cost_ns(EntryPoint::mem_unmap, size_t{1} << 30, 512), 800e3, 1e-6);
  // Entry points the table leaves out keep the built-in H100 figures.
  EXPECT_DOUBLE_EQ(m.cost_ns(EntryPoint::mem_release, size_t{2} << 20),
                   driver::CostModel::h100().cost_ns(EntryPoint::mem_release, size_t{2} << 20));
}

TEST(CostTableJson, AWholeSelftestReportIsAccepted) {
  Json report;
  report["device"] = "x";
  report["cost_table"] = Json::parse(tools::cost_table_json(sample_table()).dump());
  const auto t = tools::parse_cost_table(report, "report.json");
  EXPECT_EQ(t.by_bytes.at(EntryPoint::mem_create).size(), 2u);
}

void expect_error(const std::string& text, const std::string& words) {
  try {
    tools::parse_cost_table(Json::parse(text), "f.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("f.json: ", 0), 0u) << e.what();
  }
}

TEST(CostTableJson, BadTablesAreNamed) {
  expect_error(R"([1, 2])", "a cost table is a JSON object");
  expect_error(R"({"cuMemFoo": [{"bytes": 1, "seconds": 1}]})", "unknown entry point \"cuMemFoo\"");
  expect_error(R"({"cuMemMap": []})", "\"cuMemMap\" is not a non-empty array");
  expect_error(R"({"cuMemMap": [{"bytes": 1}]})", "cuMemMap[0]: missing \"seconds\"");
  expect_error(R"({"cuMemMap": [{"bytes": 1, "seconds": -1}]})",
               "cuMemMap[0]: \"seconds\" is -1, must be >= 0");
  expect_error(R"({"cuMemMap": [{"bytes": "2MiB", "seconds": 1}]})",
               "cuMemMap[0]: \"bytes\" is not a number");
  expect_error(R"({"ranges": [{"entry_point": "cuMemUnmap", "mappings": 0, "seconds": 1}]})",
               "ranges[0]: \"mappings\" is 0, must be >= 1");
  expect_error(R"({"ranges": [{"mappings": 2, "seconds": 1}]})", "ranges[0]: missing \"entry_point\"");
}

}  // namespace
}  // namespace expanse::test
