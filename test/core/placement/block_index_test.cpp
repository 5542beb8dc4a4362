// The free index on its own (block_index.hpp): carving, coalescing by owner, making blocks safe,
// the order and budget of searches, and what a stream's fence can make safe.
#include "core/placement/block_index.hpp"
#include "core/base/options.hpp"
#include "core/placement/reservation.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace expanse::test {
namespace {

using core::Arena;
using core::Block;
using core::BlockIt;
using core::BlockState;
using core::StreamKey;

constexpr size_t kPage = size_t{1} << 20;
constexpr CUdeviceptr kBase = CUdeviceptr{1} << 40;
constexpr Arena kA = Arena::large;

class BlockIndexTest : public ::testing::Test {
 protected:
  // A fresh reservation of 16 pages: one safe free block.
  BlockIndexTest() : r_(0, kA, kBase, 16 * kPage, kPage) { index_.add_reservation(r_); }

  BlockIt at(CUdeviceptr offset) { return index_.blocks().find(kBase + offset); }
  // Carves [offset, offset+bytes) out of the free block around it; returned live (out of the
  // index).
  BlockIt carve(size_t offset, size_t bytes) {
    auto c = index_.blocks().upper_bound(kBase + offset);
    --c;
    BlockIt it = index_.carve(c, bytes, kA, static_cast<size_t>(kBase + offset - c->first));
    it->second.state = BlockState::live;
    return it;
  }
  // Frees a carved block as owned by `stream` (free number seq); 0: as safe, freed by nobody.
  BlockIt free_owned(BlockIt it, StreamKey stream, uint64_t seq) {
    it->second.safe = stream == 0;
    it->second.stream = stream;
    it->second.seq = seq;
    return index_.insert_free(it, kA);
  }

  core::Reservation r_;
  core::BlockIndex index_;
};

TEST_F(BlockIndexTest, ANewReservationIsOneSafeFreeBlock) {
  ASSERT_EQ(index_.blocks().size(), 1u);
  const Block& b = at(0)->second;
  EXPECT_EQ(b.size, 16 * kPage);
  EXPECT_EQ(b.state, BlockState::free);
  EXPECT_TRUE(b.safe);
  EXPECT_EQ(b.freed_by, core::kNeverFreed);
  EXPECT_EQ(index_.free_blocks(), 1u);
  EXPECT_FALSE(index_.any_unsafe());
}

TEST_F(BlockIndexTest, CarveLeavesWhatLiesBeforeAndAfterFreeWithTheSameOwner) {
  BlockIt x = carve(0, 4 * kPage);
  x = free_owned(x, 7, 3);  // owned by stream 7
  ASSERT_EQ(index_.blocks().size(), 1u) << "never-freed safe memory merges into an owned block";
  EXPECT_FALSE(x->second.safe);
  EXPECT_EQ(x->second.stream, 7u);
  // Carve from the middle of the owned block: both rests stay owned by 7 with its seq.
  BlockIt y = carve(2 * kPage, 1024);
  EXPECT_EQ(y->first, kBase + 2 * kPage);
  EXPECT_EQ(y->second.size, 1024u);
  const Block& before = at(0)->second;
  const Block& after = at(2 * kPage + 1024)->second;
  EXPECT_EQ(before.size, 2 * kPage);
  EXPECT_EQ(after.size, 14 * kPage - 1024);
  for (const Block* b : {&before, &after}) {
    EXPECT_EQ(b->state, BlockState::free);
    EXPECT_FALSE(b->safe);
    EXPECT_EQ(b->stream, 7u);
    EXPECT_EQ(b->seq, 3u);
  }
  EXPECT_EQ(index_.free_blocks(), 2u);
}

TEST_F(BlockIndexTest, SafeNeighboursAlwaysCoalesce) {
  BlockIt a = carve(0, kPage);
  BlockIt b = carve(kPage, kPage);
  free_owned(a, 0, 0);
  EXPECT_EQ(index_.free_blocks(), 2u) << "b is live between a and the rest";
  free_owned(b, 0, 0);
  EXPECT_EQ(index_.blocks().size(), 1u);
  EXPECT_EQ(at(0)->second.size, 16 * kPage);
}

TEST_F(BlockIndexTest, BlocksOwnedBySameStreamCoalesceOthersDoNot) {
  BlockIt a = carve(0, kPage);
  BlockIt b = carve(kPage, kPage);
  BlockIt c = carve(2 * kPage, kPage);
  BlockIt rest = carve(3 * kPage, 13 * kPage);  // keeps never-freed memory out of the merges
  free_owned(a, 5, 1);
  free_owned(b, 5, 4);
  ASSERT_EQ(at(0)->second.size, 2 * kPage) << "two blocks owned by stream 5 merge";
  EXPECT_EQ(at(0)->second.seq, 4u) << "a merge keeps the larger free number";
  free_owned(c, 6, 2);
  EXPECT_EQ(at(2 * kPage)->second.size, kPage) << "stream 6's block stays apart from stream 5's";
  EXPECT_EQ(index_.free_blocks(), 2u);
  free_owned(rest, 0, 0);
}

TEST_F(BlockIndexTest, SafeMemoryJoinsAnOwnedBlockOnlyIfItsOwnerFreedItOrNobodyDid) {
  BlockIt a = carve(0, kPage);
  BlockIt b = carve(kPage, kPage);
  BlockIt c = carve(2 * kPage, kPage);
  BlockIt rest = carve(3 * kPage, 13 * kPage);
  // a: freed by 5, proven (safe, freed_by 5). b: owned by 6. They do not merge: 6 would get 5's
  // memory and every other stream would wait for 6's fence.
  a = free_owned(a, 5, 1);
  a = index_.make_safe(a, kA);
  EXPECT_TRUE(a->second.safe);
  EXPECT_EQ(a->second.freed_by, 5u);
  b = free_owned(b, 6, 2);
  EXPECT_EQ(at(0)->second.size, kPage);
  EXPECT_EQ(at(kPage)->second.size, kPage);
  // c owned by 5 stays apart from b, owned by 6.
  c = free_owned(c, 5, 3);
  EXPECT_EQ(index_.free_blocks(), 3u);
  // b made safe (freed_by 6): merges with a (safe) into a safe block freed by many, and c (owned
  // by 5) stays apart, as the merged block was not freed by 5 alone.
  b = index_.make_safe(at(kPage), kA);
  EXPECT_EQ(b->first, kBase);
  EXPECT_EQ(b->second.size, 2 * kPage);
  EXPECT_TRUE(b->second.safe);
  EXPECT_EQ(b->second.freed_by, core::kFreedByMany);
  EXPECT_EQ(at(2 * kPage)->second.size, kPage);
  free_owned(rest, 0, 0);
}

TEST_F(BlockIndexTest, MakeSafeRecordsWhoFreedItAndCoalesces) {
  BlockIt a = carve(0, kPage);
  BlockIt b = carve(kPage, kPage);
  BlockIt rest = carve(2 * kPage, 14 * kPage);
  a = free_owned(a, 9, 1);
  b = free_owned(b, 9, 2);  // merges with a
  ASSERT_EQ(index_.free_blocks(), 1u);
  EXPECT_TRUE(index_.any_unsafe());
  EXPECT_EQ(index_.streams_with_unsafe(), std::vector<StreamKey>{9});
  BlockIt s = index_.make_safe(at(0), kA);
  EXPECT_TRUE(s->second.safe);
  EXPECT_EQ(s->second.freed_by, 9u);
  EXPECT_EQ(s->second.stream, 0u);
  EXPECT_EQ(s->second.seq, 0u);
  EXPECT_FALSE(index_.any_unsafe());
  // Safe memory freed by 9 and a later free by 9 merge (9 owns the merge).
  free_owned(rest, 9, 5);
  EXPECT_EQ(index_.blocks().size(), 1u);
  EXPECT_FALSE(at(0)->second.safe);
  EXPECT_EQ(at(0)->second.stream, 9u);
}

TEST_F(BlockIndexTest, OwnedUpToListsTheStreamsBlocksFreedUpToASequenceNumber) {
  BlockIt a = carve(0, kPage);
  carve(kPage, kPage);  // live: keeps a and c apart
  BlockIt c = carve(2 * kPage, kPage);
  carve(3 * kPage, 13 * kPage);
  free_owned(a, 4, 10);
  free_owned(c, 4, 20);
  EXPECT_EQ(index_.owned_up_to(kA, 4, 9).size(), 0u);
  ASSERT_EQ(index_.owned_up_to(kA, 4, 10).size(), 1u);
  EXPECT_EQ(index_.owned_up_to(kA, 4, 10)[0]->first, kBase);
  EXPECT_EQ(index_.owned_up_to(kA, 4, 20).size(), 2u);
  EXPECT_EQ(index_.owned_up_to(kA, 5, 20).size(), 0u) << "another stream's";
  EXPECT_EQ(index_.owned_up_to(Arena::small, 4, 20).size(), 0u) << "another arena's";
}

TEST_F(BlockIndexTest, BestFitTakesTheSmallestBlockTheStreamMayUse) {
  // Free: 1 page owned by 3, 2 pages safe, 4 pages owned by 8 (live blocks between).
  BlockIt a = carve(0, kPage);
  carve(kPage, kPage);
  BlockIt b = carve(2 * kPage, 2 * kPage);
  carve(4 * kPage, kPage);
  BlockIt c = carve(5 * kPage, 4 * kPage);
  carve(9 * kPage, 7 * kPage);
  free_owned(a, 3, 1);
  free_owned(b, 0, 0);
  free_owned(c, 8, 1);
  EXPECT_EQ(index_.best_fit(kA, kPage, 3)->first, kBase) << "stream 3's own block";
  EXPECT_EQ(index_.best_fit(kA, kPage, 8)->first, kBase + 2 * kPage) << "the safe one";
  EXPECT_EQ(index_.best_fit(kA, 3 * kPage, 8)->first, kBase + 5 * kPage) << "8's own";
  EXPECT_EQ(index_.best_fit(kA, 3 * kPage, 3), index_.end()) << "8's block is not 3's to use";
  EXPECT_EQ(index_.best_fit(Arena::small, kPage, 3), index_.end());
}

TEST_F(BlockIndexTest, FirstFitWhereGoesBySizeOwnBlocksFirstWithinABudget) {
  // Free: 2 pages safe at 0, 2 pages owned by 3 at 3, 5 pages safe at 6.
  BlockIt a = carve(0, 2 * kPage);
  carve(2 * kPage, kPage);
  BlockIt b = carve(3 * kPage, 2 * kPage);
  carve(5 * kPage, kPage);
  BlockIt c = carve(6 * kPage, 5 * kPage);
  carve(11 * kPage, 5 * kPage);
  free_owned(a, 0, 0);
  free_owned(b, 3, 1);
  free_owned(c, 0, 0);
  std::vector<CUdeviceptr> seen;
  auto none = [&](BlockIt it) {
    seen.push_back(it->first - kBase);
    return false;
  };
  EXPECT_EQ(index_.first_fit_where(kA, kPage, 3, 10, none), index_.end());
  EXPECT_EQ(seen, (std::vector<CUdeviceptr>{3 * kPage, 0, 6 * kPage}))
      << "size order; of two the same size, the stream's own first";
  seen.clear();
  index_.first_fit_where(kA, kPage, 4, 10, none);
  EXPECT_EQ(seen, (std::vector<CUdeviceptr>{0, 6 * kPage})) << "another stream sees safe blocks";
  seen.clear();
  index_.first_fit_where(kA, kPage, 3, 2, none);
  EXPECT_EQ(seen.size(), 2u) << "no more candidates than the budget";
  BlockIt big = index_.first_fit_where(kA, kPage, 3, 10,
                                       [](BlockIt it) { return it->second.size >= 5 * kPage; });
  EXPECT_EQ(big->first, kBase + 6 * kPage);
}

TEST_F(BlockIndexTest, RemoveReservationDropsItsOneFreeBlock) {
  index_.remove_reservation(r_);
  EXPECT_TRUE(index_.blocks().empty());
  EXPECT_EQ(index_.free_blocks(), 0u);
}

}  // namespace
}  // namespace expanse::test
