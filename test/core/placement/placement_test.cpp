// Placement on its own (placement.hpp): reservations within the VA budget, where a block goes in a
// free block (tight offsets, handles it may cover), exact-size reuse, what can be reclaimed, and
// the books' check. Mappings here are booked on the reservation only (no driver call): placement
// reads the books, never the driver.
#include "parts_fixture.hpp"

#include <vector>

namespace expanse::test {
namespace {

using core::Arena;
using core::BlockIt;
using core::BlockState;
using core::Placement;

constexpr CUmemGenericAllocationHandle kFake = 0xfeed;

class PlacementTest : public CorePartsTest {
 protected:
  // Books a granted handle of n pages at page `first` of r (no driver call).
  void book(core::Reservation& r, size_t first, size_t n) {
    r.note_mapped(first, n, kFake);
    for (size_t p = first; p < first + n; ++p) r.granted[p] = 1;
  }
  void unbook_all(core::Reservation& r) {
    for (const core::HandleRun& h : r.handles_in(0, r.page_count())) r.note_unmapped(h);
  }
};

TEST_F(PlacementTest, ReservationsTakeTheArenaSizeWithinTheBudget) {
  core::Reservation* large = placement_->add_reservation(Arena::large, P);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(large->size, 64 * P);
  core::Reservation* small = placement_->add_reservation(Arena::small, 512);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->size, 16 * P);
  core::Reservation* big = placement_->add_reservation(Arena::large, 100 * P + 1);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->size, 101 * P) << "a request larger than the arena size gets its own size";
  EXPECT_EQ(placement_->va_reserved(), 181 * P);
  // 75 pages of budget left: a full 64-page reservation fits, then only what is asked.
  ASSERT_NE(placement_->add_reservation(Arena::large, P), nullptr);
  core::Reservation* last = placement_->add_reservation(Arena::large, 2 * P);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->size, 2 * P) << "the budget's rest";
  EXPECT_EQ(placement_->add_reservation(Arena::large, 10 * P), nullptr) << "budget spent";
  EXPECT_EQ(stats_.peak_va_reserved_bytes, 247 * P);
  EXPECT_EQ(placement_->index().free_blocks(), 5u);
}

TEST_F(PlacementTest, FindTightTakesTheBestFitAtItsStart) {
  size_t off = 99;
  EXPECT_EQ(placement_->find_tight(4 * P, Arena::large, 1, 32, &off), placement_->index().end());
  core::Reservation* r = placement_->add_reservation(Arena::large, P);
  BlockIt it = placement_->find_tight(4 * P, Arena::large, 1, 32, &off);
  ASSERT_NE(it, placement_->index().end());
  EXPECT_EQ(it->first, r->base);
  EXPECT_EQ(off, 0u);
  EXPECT_EQ(placement_->arena_for(1 * MiB), Arena::small);
  EXPECT_EQ(placement_->arena_for(1 * MiB + 512), Arena::large);
}

TEST_F(PlacementTest, TightOffsetSkipsToAPageBoundaryWhenTheFirstPageIsNobodys) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  BlockIt head = carve(r, 0, 512);
  r.touch(head->first, 512);  // live: the free block after it shares its first page
  BlockIt c = std::next(head);
  size_t off = 99;
  ASSERT_TRUE(placement_->tight_offset(c, P + P / 2, &off));
  EXPECT_EQ(off, 0u) << "the first page is touched already: 1 new page at its start";
  // The head block pending (freed, waiting for another stream): its page is nobody's, so a block
  // at c's start would touch 3 new pages for 2 pages' worth: it goes on the next page boundary.
  r.untouch(head->first, 512);
  head->second.state = BlockState::pending;
  ASSERT_TRUE(placement_->tight_offset(c, 2 * P, &off));
  EXPECT_EQ(off, P - 512);
  placement_->index().insert_free(head, Arena::large);
}

// A block of k >= 2 whole pages goes on the page boundary when the pages there are unmapped and
// it touches no more new pages there: one handle of k pages instead of its inner run and a
// one-page handle for its last page. Not a block of one page (one new handle either way), not
// one of a page and a half (it would touch 2 new pages where its start touches 1), and not where
// the pages are mapped (nothing is created either way: the start is kept).
TEST_F(PlacementTest, TightOffsetPutsWholePagesOnAPageBoundaryWhereItSavesAHandle) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  BlockIt head = carve(r, 0, 512);
  r.touch(head->first, 512);
  BlockIt c = std::next(head);
  size_t off = 99;
  ASSERT_TRUE(placement_->tight_offset(c, 2 * P, &off));
  EXPECT_EQ(off, P - 512) << "2 whole pages, 2 new pages either way: on the boundary";
  ASSERT_TRUE(placement_->tight_offset(c, 5 * P, &off));
  EXPECT_EQ(off, P - 512);
  ASSERT_TRUE(placement_->tight_offset(c, P, &off));
  EXPECT_EQ(off, 0u) << "one page: one new handle either way";
  ASSERT_TRUE(placement_->tight_offset(c, 2 * P + 512, &off));
  EXPECT_EQ(off, 0u) << "not whole pages";
  book(r, 2, 1);  // a page the boundary placement would cover is mapped
  ASSERT_TRUE(placement_->tight_offset(c, 2 * P, &off));
  EXPECT_EQ(off, 0u) << "mapped memory keeps its start";
  ASSERT_TRUE(placement_->tight_offset(c, P + P, &off, true));
  EXPECT_EQ(off, P - 512) << "whole_pages: always the boundary";
  unbook_all(r);
  r.untouch(head->first, 512);
  placement_->index().insert_free(head, Arena::large);
}

TEST_F(PlacementTest, HandlesFitOnlyWhereTheBlockHoldsThemOrCanSplitThem) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  book(r, 0, 4);
  book(r, 4, 1);
  BlockIt c = placement_->index().blocks().find(r.base);
  using Fit = Placement::HandleFit;
  EXPECT_TRUE(placement_->handles_fit(c, 0, 4 * P, Fit::ready)) << "holds the 4-page handle";
  EXPECT_TRUE(placement_->handles_fit(c, 0, 5 * P, Fit::ready));
  EXPECT_FALSE(placement_->handles_fit(c, 0, 2 * P, Fit::ready)) << "covers half of it";
  EXPECT_TRUE(placement_->handles_fit(c, 0, 2 * P, Fit::splittable)) << "c is safe: split";
  EXPECT_FALSE(placement_->handles_fit(c, 0, 6 * P, Fit::ready)) << "page 5 is not mapped";
  EXPECT_TRUE(placement_->handles_fit(c, 0, 6 * P, Fit::splittable));
  EXPECT_TRUE(placement_->handles_fit(c, 4 * P, P, Fit::ready)) << "the one-page handle";
  // A block of 4 pages needs no driver call at the start. One of 1 page would split the 4-page
  // handle at the start, and the block's end is not mapped: no ready place.
  size_t off = 99;
  BlockIt it = placement_->find_ready(4 * P, Arena::large, 1, 100, &off);
  EXPECT_EQ(it, c);
  EXPECT_EQ(off, 0u);
  EXPECT_EQ(placement_->find_ready(P, Arena::large, 1, 100, &off), placement_->index().end());
  // With the block ending after the one-page handle, its end is the ready place.
  BlockIt wall = placement_->index().carve(c, P, Arena::large, 5 * P);
  wall->second.state = BlockState::live;
  c = placement_->index().blocks().find(r.base);
  it = placement_->find_ready(P, Arena::large, 1, 100, &off);
  EXPECT_EQ(it, c);
  EXPECT_EQ(off, 4 * P) << "the block's end (the one-page handle), not the start of the 4-page one";
  placement_->index().insert_free(wall, Arena::large);
  c = placement_->index().blocks().find(r.base);
  // Unproven free memory: a split waits for its proof (splittable), or is possible once proven
  // (splittable_unproven: what best fit chooses before proving).
  c->second.safe = false;
  EXPECT_FALSE(placement_->handles_fit(c, 0, 2 * P, Fit::splittable));
  EXPECT_TRUE(placement_->handles_fit(c, 0, 2 * P, Fit::splittable_unproven));
  c->second.safe = true;
  unbook_all(r);
  EXPECT_EQ(placement_->find_ready(4 * P, Arena::large, 1, 100, &off), placement_->index().end())
      << "nothing mapped";
}

TEST_F(PlacementTest, ReuseRecentTakesAPlaceThatIsStillAFreeBlockOfItsSizeAndMapped) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  book(r, 0, 2);
  std::vector<core::ReusePlace> recent = {{r.base + 8 * P, 2 * P}, {r.base, 2 * P}};
  // The place lies at the start of the reservation's one free block: taking it would cut that
  // block (best fit decides), so it is not reused.
  EXPECT_EQ(placement_->reuse_recent(recent, 1, 2 * P, Arena::large, 100),
            placement_->index().end());
  // A live block after it leaves the place a free block of its own size.
  BlockIt wall = placement_->index().carve(placement_->index().blocks().find(r.base), P,
                                           Arena::large, 2 * P);
  wall->second.state = BlockState::live;
  BlockIt it = placement_->reuse_recent(recent, 1, 2 * P, Arena::large, 100);
  ASSERT_NE(it, placement_->index().end());
  EXPECT_EQ(it->first, r.base) << "the latest place, mapped";
  EXPECT_EQ(it->second.state, BlockState::live);
  EXPECT_EQ(recent.size(), 1u) << "the place used is dropped";
  // The other place is free but not mapped: reusing it would need driver calls.
  EXPECT_EQ(placement_->reuse_recent(recent, 1, 2 * P, Arena::large, 100),
            placement_->index().end());
  EXPECT_EQ(recent.size(), 1u);
  // Another size never takes a place.
  EXPECT_EQ(placement_->reuse_recent(recent, 1, P, Arena::large, 100), placement_->index().end());
  placement_->index().insert_free(it, Arena::large);
  placement_->index().insert_free(wall, Arena::large);
  unbook_all(r);
}

TEST_F(PlacementTest, ReclaimableHandlesLieWhollyInsideSafeFreeBlocks) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  book(r, 0, 4);
  book(r, 4, 1);
  auto pages = [&] {
    std::vector<size_t> out;
    for (const core::ReclaimableHandle& h : placement_->reclaimable_handles()) {
      out.push_back(h.head);
      out.push_back(h.pages);
    }
    return out;
  };
  EXPECT_EQ(pages(), (std::vector<size_t>{0, 4, 4, 1}));
  BlockIt live = carve(r, 0, 512);  // the free block now starts inside page 0
  EXPECT_EQ(pages(), (std::vector<size_t>{4, 1}));
  placement_->index().insert_free(live, Arena::large);
  unbook_all(r);
}

TEST_F(PlacementTest, CheckRecountsTheBooksAndNamesAViolation) {
  core::Reservation& r = *placement_->add_reservation(Arena::large, P);
  book(r, 0, 2);
  book(r, 2, 1);  // the block's last page: shared with the next block, a one-page handle
  BlockIt b = carve(r, 0, 2 * P + 512);
  r.touch(b->first, b->second.size);
  size_t touched = 0, mapped = 0, free_blocks = 0;
  EXPECT_EQ(placement_->check(&touched, &mapped, &free_blocks), "");
  EXPECT_EQ(touched, 3u);
  EXPECT_EQ(mapped, 3u);
  EXPECT_EQ(free_blocks, 1u);
  r.untouch(b->first, b->second.size);  // a live block whose pages nobody counts
  EXPECT_NE(placement_->check(&touched, &mapped, &free_blocks).find("edge count"),
            std::string::npos);
  r.touch(b->first, b->second.size);
  // A live block covering part of a multi-page handle.
  unbook_all(r);
  book(r, 0, 1);
  book(r, 1, 2);
  EXPECT_NE(placement_->check(&touched, &mapped, &free_blocks).find("covers part of the 2-page"),
            std::string::npos);
  r.untouch(b->first, b->second.size);
  placement_->index().insert_free(b, Arena::large);
  unbook_all(r);
}

}  // namespace
}  // namespace expanse::test
