// Sharing records as hostile input (ipc_record_fuzz.hpp), with seeded choices: every kind of lie
// about a record, directly and through a Unix socket. EXPANSE_FUZZ_RECORDS sets the trials per
// seed (default 1500), EXPANSE_FUZZ_SEEDS the seeds (default 3).
#include "ipc_record_fuzz.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace expanse::test::fuzz {
namespace {

size_t env_or(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST(IpcRecordFuzzTest, EveryLieIsRefusedByNameOrImportsOnlyWhatTheHandlesHold) {
  ASSERT_EQ(expanse_init("driver:sim,sim_devices:2,sim_capacity:1GiB,sim_posix_fd:true"),
            EXPANSE_OK)
      << expanse_last_error();
  const size_t trials = env_or("EXPANSE_FUZZ_RECORDS", 1500);
  for (uint64_t seed = 1; seed <= env_or("EXPANSE_FUZZ_SEEDS", 3); ++seed) {
    IpcRecordFuzzer f;
    SeededChoices c(seed, trials * 16);
    f.run(c, trials);
    f.finish();
    std::string report;
    for (size_t i = 0; i < f.failures().size() && i < 30; ++i) report += f.failures()[i] + "\n";
    EXPECT_TRUE(f.failures().empty()) << "seed " << seed << ", " << f.failures().size()
                                      << " failures:\n" << report;
    EXPECT_EQ(f.trials(), trials);
    EXPECT_GT(f.imported(), trials / 20) << "the honest records import";
    EXPECT_GT(f.refused(), trials / 2) << "most lies are refused";
  }
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
}

}  // namespace
}  // namespace expanse::test::fuzz
