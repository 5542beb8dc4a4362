// Page supply on its own (page_supply.hpp): the handles planned for a block and the driver calls
// that map them, reclaim from under safe free memory, trimming, the limit, and the page books.
#include "parts_fixture.hpp"

namespace expanse::test {
namespace {

using driver::EntryPoint;

class PageSupplyTest : public CorePartsTest {
 protected:
  // A carved block of `bytes` at the start of a new large reservation.
  core::BlockIt block(size_t bytes) {
    core::Reservation& r = *placement_->add_reservation(core::Arena::large, P);
    return carve(r, 0, bytes);
  }
  core::Reservation& res_of(core::BlockIt it) { return placement_->res(it->second.res); }
  void free_block(core::BlockIt it) {
    supply_->untouch(res_of(it), it->first, it->second.size);
    placement_->index().insert_free(it, core::Arena::large);
  }
};

TEST_F(PageSupplyTest, EnsurePagesMapsOneHandleForTheInnerPagesAndOneForTheEdgePage) {
  core::BlockIt b = block(2 * P + 512);
  core::Reservation& r = res_of(b);
  sim::reset_counts();
  core::PageRequest req;
  ASSERT_TRUE(supply_->ensure_pages(r, b->first, b->second.size, req));
  EXPECT_EQ(req.needed, 3u);
  EXPECT_EQ(req.created, 3u);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_create), 2u) << "pages 0-1, and page 2";
  EXPECT_EQ(sim::call_count(EntryPoint::mem_map), 2u);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_set_access), 1u) << "one run";
  EXPECT_EQ(r.handle_pages(0), 2u);
  EXPECT_EQ(r.handle_pages(2), 1u);
  EXPECT_TRUE(r.all_ready(0, 2));
  EXPECT_EQ(supply_->mapped_pages(), 3u);
  EXPECT_EQ(supply_->held_pages(), 3u);
  EXPECT_EQ(stats_.num_created_pages, 3u);
  EXPECT_EQ(stats_.peak_mapped_bytes, 3 * P);
  supply_->touch(r, b->first, b->second.size);
  EXPECT_EQ(supply_->touched_pages(), 3u);
  EXPECT_EQ(supply_->pages_left(), supply_->capacity_pages() - 3);
  // Already there: nothing more to do, no driver call.
  const uint64_t calls = sim::total_calls();
  EXPECT_TRUE(supply_->ensure_pages(r, b->first, b->second.size, req));
  EXPECT_EQ(sim::total_calls(), calls);
  free_block(b);
  EXPECT_EQ(supply_->touched_pages(), 0u);
}

TEST_F(PageSupplyTest, ReclaimUnmapsHandlesUnderSafeFreeMemoryIntoThePoolAndTrimReleasesThem) {
  core::BlockIt b = block(4 * P);
  core::Reservation& r = res_of(b);
  core::PageRequest req;
  ASSERT_TRUE(supply_->ensure_pages(r, b->first, b->second.size, req));
  supply_->touch(r, b->first, b->second.size);
  EXPECT_EQ(supply_->reclaim(4), 0u) << "under a live block: nothing to reclaim";
  free_block(b);
  sim::reset_counts();
  EXPECT_EQ(supply_->reclaim(1), 4u) << "whole handles only";
  EXPECT_EQ(sim::call_count(EntryPoint::mem_unmap), 1u);
  EXPECT_EQ(supply_->mapped_pages(), 0u);
  EXPECT_EQ(supply_->pooled_pages(), 4u);
  EXPECT_EQ(stats_.num_reclaimed_pages, 4u);
  supply_->trim_to(0);
  EXPECT_EQ(supply_->held_pages(), 0u);
  EXPECT_EQ(stats_.num_released_pages, 4u);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_release), 1u);
}

TEST_F(PageSupplyTest, APooledHandleOfTheSlotsSizeIsMappedAgainWithoutCreating) {
  core::BlockIt b = block(4 * P);
  core::Reservation& r = res_of(b);
  core::PageRequest req;
  ASSERT_TRUE(supply_->ensure_pages(r, b->first, b->second.size, req));
  supply_->touch(r, b->first, b->second.size);
  free_block(b);
  ASSERT_EQ(supply_->reclaim(4), 4u);
  core::BlockIt again = carve(r, 8 * P, 4 * P);  // elsewhere in the reservation
  sim::reset_counts();
  core::PageRequest req2;
  ASSERT_TRUE(supply_->ensure_pages(r, again->first, again->second.size, req2));
  EXPECT_EQ(req2.from_pool, 4u);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_create), 0u);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_map), 1u);
  EXPECT_EQ(supply_->pooled_pages(), 0u);
  placement_->index().insert_free(again, core::Arena::large);
}

TEST_F(PageSupplyTest, TheLimitStopsCreationAndTheRequestFailsWithNothingMapped) {
  supply_->set_limit_pages(1);
  core::BlockIt b = block(2 * P + 512);
  core::Reservation& r = res_of(b);
  core::PageRequest req;
  EXPECT_FALSE(supply_->ensure_pages(r, b->first, b->second.size, req));
  EXPECT_TRUE(req.limit_hit);
  EXPECT_TRUE(req.waited) << "waited for every stream before giving up";
  EXPECT_EQ(supply_->mapped_pages(), 0u);
  EXPECT_LE(supply_->held_pages(), 1u) << "what was created for it is pooled, within the limit";
  EXPECT_EQ(supply_->pages_left(), 1u);
  supply_->trim_to(0);
  placement_->index().insert_free(b, core::Arena::large);
}

}  // namespace
}  // namespace expanse::test
