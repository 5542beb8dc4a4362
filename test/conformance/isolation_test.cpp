// The suite's own crash isolation (isolation.hpp), on the in-process sim. The Child* cases crash,
// fail, skip, hang or pass on purpose; they run only in a child that run_isolated starts (they
// skip elsewhere, so they never fail the suite), and the other cases check what comes back.
#include "conformance.hpp"

#include <gtest/gtest-spi.h>

#include <chrono>
#include <csignal>
#include <thread>
#include <vector>

namespace expanse::conformance {
namespace {

class Isolation : public Conformance {
 protected:
  // The full name of this instance's case `name` (the same suite and driver).
  std::string sibling(const std::string& name) const {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->test_suite_name()) + "." + name + "/" + variant_name(variant());
  }
  // What report_isolated makes of run, caught instead of failing this case.
  static std::vector<::testing::TestPartResult> reported(const IsolatedRun& run,
                                                         const std::string& name) {
    ::testing::TestPartResultArray results;
    {
      ::testing::ScopedFakeTestPartResultReporter catcher(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
      report_isolated(run, name);
    }
    std::vector<::testing::TestPartResult> out;
    for (int i = 0; i < results.size(); ++i) out.push_back(results.GetTestPartResult(i));
    return out;
  }
  void mem_get_info() {
    size_t free_bytes = 0;
    size_t total = 0;
    make_current();
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free_bytes, &total));
  }
};

#define ONLY_IN_ISOLATED_CHILD() \
  if (!in_isolated_child()) GTEST_SKIP() << "runs only in a child started by Isolation's checks"

TEST_P(Isolation, ChildCrashesAfterANamedCall) {
  ONLY_IN_ISOLATED_CHILD();
  ADD_FAILURE_AT("before_the_crash.cpp", 7) << "a failure before the crash";
  journal_step("the crash on purpose");
  mem_get_info();
  // The default action, as a driver's fault has without a sanitizer (whose handler would exit).
  std::signal(SIGSEGV, SIG_DFL);
  std::raise(SIGSEGV);
  ADD_FAILURE() << "alive after SIGSEGV";
}

TEST_P(Isolation, ChildFailsTwice) {
  ONLY_IN_ISOLATED_CHILD();
  mem_get_info();
  ADD_FAILURE_AT("somewhere.cpp", 17) << "first\n\tsecond line \\ with a backslash";
  ADD_FAILURE_AT("elsewhere.cpp", 42) << "second";
}

TEST_P(Isolation, ChildSkips) {
  ONLY_IN_ISOLATED_CHILD();
  GTEST_SKIP() << "skipped in the child";
}

TEST_P(Isolation, ChildPasses) {
  ONLY_IN_ISOLATED_CHILD();
  mem_get_info();
}

TEST_P(Isolation, ChildHangs) {
  ONLY_IN_ISOLATED_CHILD();
  journal_step("the hang on purpose");
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

// A crash is ONE failure of its case, naming the last driver call the child made (and that it
// returned), its step and the failures it reported first; this process goes on.
TEST_P(Isolation, CrashIsOneFailureNamingTheLastCall) {
  const std::string name = sibling("ChildCrashesAfterANamedCall");
  const IsolatedRun run = run_isolated(name);
  EXPECT_EQ(run.end, IsolatedRun::End::died) << death_report(run, name);
  EXPECT_EQ(run.signal, SIGSEGV);
  EXPECT_FALSE(run.case_ended);
  EXPECT_EQ(run.last_call.rfind("cuMemGetInfo(0x", 0), 0u) << run.last_call;
  EXPECT_TRUE(run.last_call_returned);
  EXPECT_EQ(run.last_code, CUDA_SUCCESS);
  EXPECT_EQ(run.last_step, "the crash on purpose");
  ASSERT_EQ(run.failures.size(), 1u);

  const std::vector<::testing::TestPartResult> results = reported(run, name);
  ASSERT_EQ(results.size(), 1u);
  const ::testing::TestPartResult& r = results[0];
  EXPECT_TRUE(r.nonfatally_failed());
  const std::string m = r.message();
  const std::vector<std::string> parts = {
      name + " died in its isolated child process: killed by signal " + std::to_string(SIGSEGV),
      "after its last driver call cuMemGetInfo(0x", "returned CUDA_SUCCESS (0)",
      "in the step: the crash on purpose",
      "before_the_crash.cpp:7: Failed\na failure before the crash"};
  for (const std::string& part : parts) {
    EXPECT_NE(m.find(part), std::string::npos) << "no \"" << part << "\" in:\n" << m;
  }
  mem_get_info();  // the parent's driver is untouched
}

// A child's failures come back one by one, at their files and lines, with their messages intact.
TEST_P(Isolation, ChildFailuresComeBackAtTheirLines) {
  const std::string name = sibling("ChildFailsTwice");
  const IsolatedRun run = run_isolated(name);
  EXPECT_EQ(run.end, IsolatedRun::End::failed) << death_report(run, name);
  EXPECT_TRUE(run.case_ended);
  EXPECT_EQ(run.exit_code, 1);
  const std::vector<::testing::TestPartResult> results = reported(run, name);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_STREQ(results[0].file_name(), "somewhere.cpp");
  EXPECT_EQ(results[0].line_number(), 17);
  EXPECT_NE(std::string(results[0].message())
                .find("[isolated child] Failed\nfirst\n\tsecond line \\ with a backslash"),
            std::string::npos)
      << results[0].message();
  EXPECT_STREQ(results[1].file_name(), "elsewhere.cpp");
  EXPECT_EQ(results[1].line_number(), 42);
}

// A skip comes back as a skip, a pass as nothing.
TEST_P(Isolation, SkipAndPassComeBackAsThemselves) {
  const IsolatedRun skipped = run_isolated(sibling("ChildSkips"));
  EXPECT_EQ(skipped.end, IsolatedRun::End::skipped) << death_report(skipped, "ChildSkips");
  const std::vector<::testing::TestPartResult> s = reported(skipped, sibling("ChildSkips"));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].skipped());
  EXPECT_NE(std::string(s[0].message()).find("skipped in the child"),
            std::string::npos);

  const IsolatedRun passed = run_isolated(sibling("ChildPasses"));
  EXPECT_EQ(passed.end, IsolatedRun::End::passed) << death_report(passed, "ChildPasses");
  EXPECT_EQ(reported(passed, sibling("ChildPasses")).size(), 0u);
}

// A child that does not end in time is killed: one failure, naming its step. A case the child
// does not have is one failure too, not a pass.
TEST_P(Isolation, HangAndUnknownCaseAreOneFailureEach) {
  const std::string hang = sibling("ChildHangs");
  const IsolatedRun run = run_isolated(hang, 5);
  EXPECT_EQ(run.end, IsolatedRun::End::timed_out) << death_report(run, hang);
  EXPECT_EQ(run.signal, SIGKILL);
  const std::vector<::testing::TestPartResult> h = reported(run, hang);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_NE(std::string(h[0].message()).find("did not end within 5 s"),
            std::string::npos)
      << h[0].message();

  const std::string unknown = sibling("NoSuchCase");
  const IsolatedRun none = run_isolated(unknown);
  EXPECT_EQ(none.end, IsolatedRun::End::not_run);
  const std::vector<::testing::TestPartResult> u = reported(none, unknown);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_NE(std::string(u[0].message()).find("ran no case named " + unknown),
            std::string::npos)
      << u[0].message();
}

// The sims never isolate (their rules run in process, hooks and all): the macro is a no-op here.
TEST_P(Isolation, SimsRunInProcess) {
  EXPECT_FALSE(ran_isolated());
}

INSTANTIATE_TEST_SUITE_P(Drivers, Isolation, ::testing::Values(Variant::sim_inprocess),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           return std::string(variant_name(i.param));
                         });

}  // namespace
}  // namespace expanse::conformance
