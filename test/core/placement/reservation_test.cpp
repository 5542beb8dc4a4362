// A reservation's books on their own (reservation.hpp): touched pages from edge counts, inner
// pages, the handle walk over a page range and the predicates on handles.
#include "core/placement/reservation.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace expanse::test {
namespace {

using core::HandleRun;
using core::PageRange;

constexpr size_t kPage = size_t{1} << 20;
constexpr CUdeviceptr kBase = CUdeviceptr{1} << 40;

core::Reservation make(size_t pages) {
  return core::Reservation(0, core::Arena::large, kBase, pages * kPage, kPage);
}

// The runs a walk visits, as (head, pages, mapped).
std::vector<std::vector<size_t>> walk(const core::HandleWalk& w) {
  std::vector<std::vector<size_t>> out;
  for (const HandleRun& h : w) out.push_back({h.head, h.pages, h.mapped ? 1u : 0u});
  return out;
}

TEST(ReservationTest, TouchCountsEachPageOnceAndSharedEdgePagesOnce) {
  core::Reservation r = make(8);
  // [0, 2.5 pages): pages 0, 1, 2.
  EXPECT_EQ(r.touch(kBase, 2 * kPage + kPage / 2), 3u);
  // [2.5, 3.5 pages) shares page 2: only page 3 is new.
  EXPECT_EQ(r.touch(kBase + 2 * kPage + kPage / 2, kPage), 1u);
  // A block inside one page already touched adds nothing.
  EXPECT_EQ(r.touch(kBase + 3 * kPage + kPage / 2, 512), 0u);
  EXPECT_EQ(r.live_blocks, 3u);
  EXPECT_EQ(r.edge_refs[2], 2u);
  EXPECT_EQ(r.edge_refs[3], 2u) << "last page of the second block, only page of the third";
  EXPECT_EQ(r.untouch(kBase + 3 * kPage + kPage / 2, 512), 0u);
  EXPECT_EQ(r.untouch(kBase, 2 * kPage + kPage / 2), 2u) << "page 2 is still the second's";
  EXPECT_EQ(r.untouch(kBase + 2 * kPage + kPage / 2, kPage), 2u);
  EXPECT_EQ(r.live_blocks, 0u);
  for (uint32_t n : r.edge_refs) EXPECT_EQ(n, 0u);
}

TEST(ReservationTest, UntouchedPagesLeavesOutEdgePagesOthersTouch) {
  core::Reservation r = make(8);
  EXPECT_EQ(r.untouched_pages(kBase + kPage / 2, 2 * kPage), 3u);
  r.touch(kBase, kPage / 2);  // page 0
  EXPECT_EQ(r.untouched_pages(kBase + kPage / 2, 2 * kPage), 2u);
  r.touch(kBase + 2 * kPage + kPage / 2, 512);  // page 2
  EXPECT_EQ(r.untouched_pages(kBase + kPage / 2, 2 * kPage), 1u);
}

TEST(ReservationTest, InnerPagesAreThePagesWhollyInside) {
  core::Reservation r = make(8);
  PageRange p = r.inner_pages(kBase, 3 * kPage);
  EXPECT_EQ(p.lo, 0u);
  EXPECT_EQ(p.hi, 3u);
  p = r.inner_pages(kBase + 512, 3 * kPage);
  EXPECT_EQ(p.lo, 1u);
  EXPECT_EQ(p.hi, 3u);
  p = r.inner_pages(kBase + 512, kPage);  // inside pages 0 and 1, neither wholly
  EXPECT_GE(p.lo, p.hi) << "empty";
}

TEST(ReservationTest, PredicatesOnHandles) {
  const PageRange inner{2, 6};
  EXPECT_TRUE(inner.holds(HandleRun{2, 4, true}));
  EXPECT_TRUE(inner.holds(HandleRun{3, 1, true}));
  EXPECT_FALSE(inner.holds(HandleRun{1, 2, true})) << "starts before";
  EXPECT_FALSE(inner.holds(HandleRun{5, 2, true})) << "ends after";
  EXPECT_TRUE(inner.admits(HandleRun{1, 1, true})) << "a one-page handle on an edge page";
  EXPECT_TRUE(inner.admits(HandleRun{2, 4, true}));
  EXPECT_FALSE(inner.admits(HandleRun{5, 2, true}));
}

TEST(ReservationTest, HandleWalkVisitsEachHandleOverTheRangeOnce) {
  core::Reservation r = make(12);
  r.note_mapped(1, 3, 11);  // pages 1-3
  r.note_mapped(4, 1, 12);  // page 4
  r.note_mapped(8, 4, 13);  // pages 8-11
  EXPECT_EQ(r.mapped_pages, 8u);
  EXPECT_EQ(r.handle_head(3), 1u);
  EXPECT_EQ(r.handle_pages(3), 3u);
  using V = std::vector<std::vector<size_t>>;
  EXPECT_EQ(walk(r.handles_in(0, 12)), (V{{1, 3, 1}, {4, 1, 1}, {8, 4, 1}}));
  // A range starting inside a handle and ending inside another: both whole.
  EXPECT_EQ(walk(r.handles_in(2, 9)), (V{{1, 3, 1}, {4, 1, 1}, {8, 4, 1}}));
  EXPECT_EQ(walk(r.handles_in(5, 8)), V{}) << "nothing mapped there";
  EXPECT_EQ(walk(r.handles_in(6, 6)), V{});
  // With gaps: the unmapped runs, cut to the range.
  EXPECT_EQ(walk(r.runs_in(0, 10)), (V{{0, 1, 0}, {1, 3, 1}, {4, 1, 1}, {5, 3, 0}, {8, 4, 1}}));
  EXPECT_EQ(walk(r.runs_in(6, 7)), (V{{6, 1, 0}}));
}

TEST(ReservationTest, NoteUnmappedClearsTheWholeHandle) {
  core::Reservation r = make(8);
  r.note_mapped(2, 3, 21);
  r.granted[2] = r.granted[3] = r.granted[4] = 1;
  EXPECT_TRUE(r.all_ready(2, 4));
  EXPECT_FALSE(r.all_ready(1, 4));
  r.note_unmapped(r.handle_at(3));
  EXPECT_EQ(r.mapped_pages, 0u);
  for (size_t p = 0; p < 8; ++p) {
    EXPECT_FALSE(r.mapped(p));
    EXPECT_FALSE(r.ready(p));
  }
}

}  // namespace
}  // namespace expanse::test
