// PlacementEcho: points name the place in a workload by its recent history; each keeps its last
// addresses, latest first; the table grows and starts over when full.
#include "core/placement/placement_echo.hpp"

#include <gtest/gtest.h>

namespace expanse::core {
namespace {

TEST(PlacementEchoTest, APointIsItsHistorySizeStreamAndLiveBlocks) {
  PlacementEcho a, b;
  for (size_t sz : {512, 4096, 1 << 20}) {
    a.note(sz, false);
    b.note(sz, false);
  }
  EXPECT_EQ(a.point(512, 7, 3, 1024), b.point(512, 7, 3, 1024));
  EXPECT_NE(a.point(512, 7, 3, 1024), a.point(1024, 7, 3, 1024));  // size
  EXPECT_NE(a.point(512, 7, 3, 1024), a.point(512, 8, 3, 1024));   // stream
  EXPECT_NE(a.point(512, 7, 3, 1024), a.point(512, 7, 4, 1024));   // live blocks
  EXPECT_NE(a.point(512, 7, 3, 1024), a.point(512, 7, 3, 2048));   // live bytes
  b.note(4096, true);  // a free since
  EXPECT_NE(a.point(512, 7, 3, 1024), b.point(512, 7, 3, 1024));
  // Only the last kHistory operations count.
  for (size_t i = 0; i < PlacementEcho::kHistory; ++i) {
    a.note(64, false);
    b.note(64, false);
  }
  EXPECT_EQ(a.point(512, 7, 3, 1024), b.point(512, 7, 3, 1024));
}

// A short point names only the last kShortHistory operations: two histories that differ before
// them share it, and a point never met finds there where the other went, unless several points
// led there.
TEST(PlacementEchoTest, AShortPointNamesTheLatestOperationsAndOnePlace) {
  PlacementEcho a, b;
  a.note(4096, false);  // differs from b's, outside the short history
  b.note(8192, true);
  for (size_t i = 0; i + 1 < PlacementEcho::kHistory; ++i) {
    a.note(512 * (i + 1), i % 2 == 0);
    b.note(512 * (i + 1), i % 2 == 0);
  }
  EXPECT_NE(a.point(512, 7, 3, 1024), b.point(512, 7, 3, 1024));
  EXPECT_EQ(a.short_point(512, 7, 3, 1024), b.short_point(512, 7, 3, 1024));
  EXPECT_NE(a.short_point(512, 7, 3, 1024), a.point(512, 7, 3, 1024));
  EXPECT_NE(a.short_point(512, 7, 3, 1024), a.short_point(1024, 7, 3, 1024));
  EXPECT_NE(a.short_point(512, 7, 3, 1024), a.short_point(512, 7, 3, 2048));
  b.note(64, false);  // one operation inside the short history
  EXPECT_NE(a.short_point(512, 7, 3, 1024), b.short_point(512, 7, 3, 1024));

  PlacementEcho e;
  e.remember(11, 0x1000);
  e.remember_short(21, 11, 0x1000);
  EXPECT_TRUE(e.known(11));
  EXPECT_FALSE(e.known(13));
  EXPECT_EQ(e.recall_short(21)[0], 0x1000u);
  e.remember(11, 0x3000);  // the same point again: still one place
  e.remember_short(21, 11, 0x3000);
  EXPECT_EQ(e.recall_short(21)[0], 0x3000u);
  e.remember(13, 0x2000);  // another point led there: no one place
  e.remember_short(21, 13, 0x2000);
  EXPECT_EQ(e.recall_short(21)[0], 0u);
  EXPECT_EQ(e.recall(13)[0], 0x2000u);
}

TEST(PlacementEchoTest, KeepsThePointsLastAddressesLatestFirst) {
  PlacementEcho e;
  EXPECT_EQ(e.recall(5)[0], 0u);  // nothing yet, no table
  e.remember(5, 0x1000);
  e.remember(5, 0x2000);
  e.remember(5, 0x1000);  // again: to the front, not twice
  auto r = e.recall(5);
  EXPECT_EQ(r[0], 0x1000u);
  EXPECT_EQ(r[1], 0x2000u);
  EXPECT_EQ(r[2], 0u);
  for (CUdeviceptr a : {0x3000, 0x4000, 0x5000}) e.remember(5, a);
  r = e.recall(5);
  EXPECT_EQ(r[0], 0x5000u);
  EXPECT_EQ(r[1], 0x4000u);
  EXPECT_EQ(r[2], 0x3000u);
  EXPECT_EQ(e.recall(7)[0], 0u);
}

TEST(PlacementEchoTest, GrowsWithThePointsAndStartsOverWhenFull) {
  PlacementEcho e;
  const uint64_t half = PlacementEcho::kMaxSlots / 2;
  for (uint64_t p = 1; p <= half; ++p) e.remember(p * 2 + 1, p);
  for (uint64_t p = 1; p <= half; p += 997) EXPECT_EQ(e.recall(p * 2 + 1)[0], p) << p;
  e.remember(3 * half * 2 + 1, 42);  // one more than fits: the table starts over
  EXPECT_EQ(e.recall(3)[0], 0u);
  EXPECT_EQ(e.recall(3 * half * 2 + 1)[0], 42u);
}

}  // namespace
}  // namespace expanse::core
