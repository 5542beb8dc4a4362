// The checked build (-DEXPANSE_CHECKED=ON): a violated invariant assert reports its text on
// stderr and aborts. Release builds compile the asserts out.
#include "core/base/check.hpp"

#include <gtest/gtest.h>

#include <string>

namespace expanse::test {
namespace {

#ifdef EXPANSE_CHECKED
TEST(CheckedBuildDeathTest, AViolatedInvariantReportsItAndAborts) {
  EXPECT_TRUE(core::kCheckedBuild);
  EXPECT_DEATH(EXPANSE_ASSERT(1 + 1 == 3), "invariant violated: 1 \\+ 1 == 3");
  EXPECT_DEATH(core::books_violated("allocate", "touched pages 3, recomputed 2"),
               "invariant violated after allocate: touched pages 3, recomputed 2");
}
#else
TEST(CheckedBuildTest, ReleaseBuildsCompileTheChecksOut) { EXPECT_FALSE(core::kCheckedBuild); }
#endif

}  // namespace
}  // namespace expanse::test
