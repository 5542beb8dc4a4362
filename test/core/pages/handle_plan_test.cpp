// plan_handles_periodic against a brute-force statement of what it promises, over many shapes:
// the slots tile the range in order, none is longer than max_pages, a page where one of the
// kPredictedBlocks predicted blocks would begin or end inside it is a slot alone while no longer
// slot holds such a page, and no slot is cut anywhere else.
#include "core/pages/handle_plan.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <set>
#include <vector>

namespace expanse::core {
namespace {

// The slots tile [s, e) in order, each of 1 .. max_pages pages.
::testing::AssertionResult tiles(const std::vector<HandleSlot>& out, size_t s, size_t e,
                                 size_t max_pages) {
  size_t at = s;
  for (const HandleSlot& h : out) {
    if (h.page != at) return ::testing::AssertionFailure() << "gap or overlap at page " << at;
    if (h.count < 1 || h.count > max_pages) {
      return ::testing::AssertionFailure() << "a " << h.count << "-page slot at page " << h.page;
    }
    at += h.count;
  }
  if (at != e) return ::testing::AssertionFailure() << "the slots end at " << at << ", not " << e;
  return ::testing::AssertionSuccess();
}

TEST(HandlePlanTest, PeriodicPlanTilesTheRangeAndIsolatesEveryPredictedBoundaryPage) {
  std::mt19937_64 rng(7);
  const size_t page = 64;  // small pages keep the brute force cheap; the plan is unit-free
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t first = rng() % 8;
    const size_t off0 = rng() % page;
    const size_t bytes = 1 + rng() % (page * 20);
    const size_t s = first + 1 + rng() % 30;
    const size_t e = s + rng() % 60;
    const size_t max_pages = 1 + rng() % 16;
    std::vector<HandleSlot> out;
    plan_handles_periodic(s, e, first, off0, bytes, page, max_pages, out);

    // Pages where a block of the sequence starts inside the page (not at its first byte).
    std::set<size_t> boundary;
    if (bytes >= page) {
      for (size_t k = 1; k <= kPredictedBlocks + 1; ++k) {
        const size_t pos = off0 + k * bytes;
        const size_t pk = first + pos / page;
        if (pk >= e) break;
        if (pos % page != 0) boundary.insert(pk);
      }
    }
    // At most two slots per predicted block, then the rest in runs of max_pages.
    ASSERT_LE(out.size(), 2 * (kPredictedBlocks + 1) + (e - s + max_pages - 1) / max_pages + 1)
        << "iter " << iter;
    ASSERT_TRUE(tiles(out, s, e, max_pages)) << "iter " << iter;
    for (const HandleSlot& h : out) {
      for (size_t p = h.page; p < h.page + h.count; ++p) {
        if (boundary.count(p) != 0) {
          ASSERT_EQ(h.count, 1u) << "iter " << iter << ": boundary page " << p << " in a "
                                 << h.count << "-page slot";
        }
      }
    }
    // Fewest slots: every slot ends at a boundary page, the range's end or max_pages.
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      const HandleSlot& h = out[i];
      const size_t next = h.page + h.count;
      const bool cut = h.count == max_pages || boundary.count(next) != 0 ||
                       boundary.count(h.page) != 0 ||
                       (bytes >= page && [&] {  // a block begins exactly at page `next`
                         for (size_t k = 1; k <= kPredictedBlocks + 1; ++k) {
                           const size_t pos = off0 + k * bytes;
                           if (first + pos / page > next) return false;
                           if (pos % page == 0 && first + pos / page == next) return true;
                         }
                         return false;
                       }());
      if (bytes >= page) {
        ASSERT_TRUE(cut) << "iter " << iter << ": slot at page " << h.page
                         << " was cut for no reason";
      }
    }
  }
}

// Near the books' limits (first page up to 2^31, blocks up to 64 GiB, handles of 1 .. 600 pages):
// the arithmetic neither overflows nor loops, and the slots still tile the range.
TEST(HandlePlanTest, PeriodicPlanTilesAtHugeSizes) {
  const size_t P = size_t{2} << 20;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const size_t first = rng() % (size_t{1} << 31);
    const size_t off0 = rng() % P;
    const size_t bytes = (rng() % 3 == 0) ? (size_t{1} << 30) * (1 + rng() % 64) + rng() % P
                                          : P + rng() % (64 * P);
    const size_t s = first + (off0 + bytes - 1) / P + 1;  // the page after the placed block
    const size_t e = s + 1 + rng() % 4096;
    const size_t max_pages = 1 + rng() % 600;
    std::vector<HandleSlot> out;
    plan_handles_periodic(s, e, first, off0, bytes, P, max_pages, out);
    ASSERT_TRUE(tiles(out, s, e, max_pages)) << "case " << i;
  }
}

TEST(HandlePlanTest, PeriodicPlanOfAFreedHandleRefilledInQuarters) {
  // 49 pages refilled by blocks of 12.25 pages; the first took pages [0, 13).
  std::vector<HandleSlot> out;
  plan_handles_periodic(13, 49, 0, 0, 49 * 4, 16, 512, out);  // page = 16 units, block 49*4
  const std::vector<std::pair<size_t, size_t>> want = {{13, 11}, {24, 1}, {25, 11}, {36, 1}, {37, 12}};
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out[i].page, want[i].first) << i;
    EXPECT_EQ(out[i].count, want[i].second) << i;
  }
}

}  // namespace
}  // namespace expanse::core
