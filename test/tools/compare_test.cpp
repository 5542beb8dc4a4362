// `expanse replay --compare / --plot / --torch-conf` on a small snapshot the test writes: the
// PyTorch model starts from the recorded state and reproduces the recorded segment events; the
// JSON keys; OOM explanations; the SVG's structure.
#include "tools_test_util.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace expanse::test {
namespace {

using Json = nlohmann::json;
constexpr uint64_t MiB = uint64_t{1} << 20;

std::string q(const std::string& s) { return "'" + s + "'"; }

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// A small-pool segment holding a 4 KiB block from before recording, and a 20 MiB large-pool
// segment PyTorch cudaMalloc'd during the trace for two 3 MiB tensors.
std::string small_snapshot(TempDir& dir) {
  return dir.write(
      "snap.pickle",
      snapshot_pickle({{0, 0x10000000, 20 * MiB, {{0x10000000, 20 * MiB, "inactive"}}},
                       {0,
                        0x20000000,
                        2 * MiB,
                        {{0x20000000, 4096}, {0x20001000, 2 * MiB - 4096, "inactive"}}}},
                      {{{"segment_alloc", 0x10000000, 20 * MiB},
                        {"alloc", 0x10000000, 3 * MiB},
                        {"alloc", 0x10300000, 3 * MiB},
                        {"alloc", 0x20001000, 512 * 1024},
                        {"free_completed", 0x10000000, 3 * MiB},
                        {"free_completed", 0x10300000, 3 * MiB},
                        {"free_completed", 0x20001000, 512 * 1024}}}));
}

TEST(CliCompare, JsonKeysAndAgreement) {
  TempDir dir;
  const std::string f = small_snapshot(dir);
  RunResult r = run_expanse("replay " + q(f) + " --compare --min-capacity --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  ASSERT_TRUE(j.contains("compare")) << r.out;
  const Json& c = j["compare"];
  for (const char* row : {"pytorch", "pytorch_expandable", "expanse"}) {
    SCOPED_TRACE(row);
    ASSERT_TRUE(c.contains(row));
    for (const char* key : {"peak_reserved_bytes", "ooms", "first_oom_event", "min_capacity_bytes",
                            "driver_calls_total", "modeled_driver_seconds"}) {
      EXPECT_TRUE(c[row].contains(key)) << key;
    }
    EXPECT_TRUE(c[row]["first_oom_event"].is_null());
    EXPECT_EQ(c[row]["ooms"].get<uint64_t>(), 0u);
    EXPECT_GE(c[row]["min_capacity_bytes"].get<uint64_t>(), j["peak_live_bytes"].get<uint64_t>());
  }
  // From the recorded start state the model needs no segment for the 512 KiB tensor (it fits
  // the small segment from before recording) and one 20 MiB segment for the two 3 MiB ones.
  EXPECT_EQ(c["pytorch"]["peak_reserved_bytes"].get<uint64_t>(), 22 * MiB);
  EXPECT_EQ(c["pytorch"]["driver_calls_total"].get<uint64_t>(), 1u);
  EXPECT_GT(c["pytorch"]["modeled_driver_seconds"].get<double>(), 0.0);
  const Json& a = c["pytorch_model_agreement"];
  EXPECT_EQ(a["recorded_segment_events"].get<uint64_t>(), 1u);
  EXPECT_EQ(a["reproduced_segment_events"].get<uint64_t>(), 1u);
  EXPECT_EQ(a["model_segment_events"].get<uint64_t>(), 1u);
  EXPECT_TRUE(a["first_difference_event"].is_null());
  EXPECT_EQ(a["recorded_peak_reserved_bytes"].get<uint64_t>(), 22 * MiB);
  EXPECT_EQ(a["model_peak_reserved_bytes"].get<uint64_t>(), 22 * MiB);
  EXPECT_TRUE(a["from_recorded_state"].get<bool>());
  EXPECT_EQ(c["pytorch_recorded"]["peak_reserved_bytes"].get<uint64_t>(), 22 * MiB);
  // With expandable segments: one 2 MiB page for the small blocks, one 20 MiB page for 6 MiB.
  EXPECT_EQ(c["pytorch_expandable"]["peak_reserved_bytes"].get<uint64_t>(), 22 * MiB);
  EXPECT_NE(c["headline"].get<std::string>().find("expandable segments"), std::string::npos);
  // Without --min-capacity the key is absent.
  r = run_expanse("replay " + q(f) + " --compare --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(Json::parse(r.out)["compare"]["pytorch"].contains("min_capacity_bytes"));
}

TEST(CliCompare, ExplainsAnOomOnASmallDevice) {
  TempDir dir;
  const std::string f = small_snapshot(dir);
  // 20 MiB: the recorded start state holds 2 MiB, so PyTorch's 20 MiB segment cannot come;
  // 6.5 MiB live would fit: fragmentation, not exhaustion.
  RunResult r = run_expanse("replay " + q(f) + " --capacity 20MiB --compare --json");
  ASSERT_NE(r.status, 2) << r.err;
  Json c = Json::parse(r.out)["compare"];
  EXPECT_GE(c["pytorch"]["ooms"].get<uint64_t>(), 1u);
  EXPECT_EQ(c["pytorch"]["first_oom_event"].get<uint64_t>(), 1u);  // after the preexisting block
  EXPECT_EQ(c["pytorch"]["first_oom"]["cause"], "fragmentation");
  EXPECT_EQ(c["pytorch"]["first_oom"]["reserved_bytes"].get<uint64_t>(), 2 * MiB);
  EXPECT_EQ(c["expanse"]["ooms"].get<uint64_t>(), 0u);
  r = run_expanse("replay " + q(f) + " --capacity 20MiB --compare");
  EXPECT_NE(r.out.find("fragmentation"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PyTorch (model)"), std::string::npos) << r.out;
}

TEST(CliCompare, PlotIsAnSvgWithEveryLineAxesAndLegend) {
  TempDir dir;
  const std::string f = small_snapshot(dir);
  const std::string svg = dir.path() + "/plot.svg";
  RunResult r = run_expanse("replay " + q(f) + " --capacity 20MiB --plot " + q(svg));
  ASSERT_NE(r.status, 2) << r.err;
  const std::string s = read_file(svg);
  std::remove(svg.c_str());
  ASSERT_EQ(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << s.substr(0, 200);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(s, "<g"), count(s, "</g>"));
  EXPECT_EQ(count(s, "class=\"series\""), 5u);
  for (const char* label : {"live bytes", "PyTorch reserved (recorded)", "PyTorch reserved (model)",
                            "expandable_segments:True", "expanse mapped", "memory (GiB)",
                            "class=\"legend\"", "class=\"capacity\"", "class=\"oom\""}) {
    EXPECT_NE(s.find(label), std::string::npos) << label;
  }
}

TEST(CliCompare, TorchConfIsCheckedAndUsed) {
  TempDir dir;
  const std::string f = small_snapshot(dir);
  RunResult r = run_expanse("replay " + q(f) + " --torch-conf 'max_split_size_mb:64,bogus:1'");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--torch-conf"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'bogus'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  r = run_expanse("replay " + q(f) + " --torch-conf max_split_size_mb:64 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Json c = Json::parse(r.out)["compare"];
  EXPECT_EQ(c["torch_conf"], "max_split_size_mb:64");
  EXPECT_EQ(c["torch_conf_source"], "--torch-conf");
}

}  // namespace
}  // namespace expanse::test
