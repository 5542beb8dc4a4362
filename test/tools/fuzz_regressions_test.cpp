// Every input under test/fuzz/regressions/ (and the fuzzers' seeds), through the reader its
// folder names: a consistent trace (test/fuzz/trace_check.hpp) or the reader's own error, never
// a crash or another exception. Under the ASan+UBSan build of CI this is the fuzzers' check.
#include "trace/pickle_reader.hpp"
#include "trace/trace.hpp"
#include "tools_test_util.hpp"

#include "../fuzz/trace_check.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace expanse::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  return out;
}

std::string regressions(const std::string& target) {
  return std::string(EXPANSE_SOURCE_DIR) + "/test/fuzz/regressions/" + target;
}

TEST(FuzzRegressions, Pickle) {
  const std::vector<std::string> files = files_in(regressions("pickle"));
  ASSERT_FALSE(files.empty());
  for (const std::string& f : files) {
    const std::string data = read_file(f);
    try {
      const trace::pickle::Document d = trace::pickle::parse(data);
      EXPECT_LT(d.root(), d.size()) << f;
    } catch (const trace::pickle::parse_error& e) {
      EXPECT_LE(e.offset(), data.size()) << f;
    }
  }
}

void check_trace_files(const std::vector<std::string>& files, bool snapshot) {
  for (const std::string& f : files) {
    const std::string data = read_file(f);
    try {
      const trace::Trace t =
          snapshot ? trace::load_snapshot(f, data) : trace::load_rmm_csv(f, data);
      EXPECT_EQ(fuzz::trace_problem(t), "") << f;
    } catch (const trace::input_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(f, 0), 0u) << "the message names the file: " << f;
    }
  }
}

TEST(FuzzRegressions, Snapshot) {
  std::vector<std::string> files = files_in(regressions("snapshot"));
  ASSERT_FALSE(files.empty());
  for (const std::string& f : files_in(std::string(EXPANSE_SOURCE_DIR) + "/test/tools/data")) {
    if (f.size() > 7 && f.compare(f.size() - 7, 7, ".pickle") == 0) files.push_back(f);
  }
  check_trace_files(files, true);
}

TEST(FuzzRegressions, RmmCsv) {
  std::vector<std::string> files = files_in(regressions("rmm_csv"));
  ASSERT_FALSE(files.empty());
  for (const std::string& f :
       files_in(std::string(EXPANSE_SOURCE_DIR) + "/test/fuzz/corpus/rmm_csv")) {
    files.push_back(f);
  }
  check_trace_files(files, false);
}

}  // namespace
}  // namespace expanse::test
