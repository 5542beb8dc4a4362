// Blocks of whole pages go on a page boundary where that saves a handle
// (Placement::tight_offset): after a block that ends inside a page, a block of k >= 2 whole pages
// on fresh memory takes one handle of k pages instead of its inner run plus a one-page handle for
// its last page. Blocks of one page, blocks of other sizes, and placements on mapped memory keep
// the start of the free block.
#include "core_fixture.hpp"

#include <cstdio>

namespace expanse::test {
namespace {

using driver::EntryPoint;

class AlignedPlacementTest : public CoreTest {};

uint64_t calls(const core::DeviceStats& s, EntryPoint e) {
  return s.driver_calls[static_cast<size_t>(e)];
}

CUdeviceptr addr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Weights-like start: one block of two pages and a half, then eight of two pages. At the free
// block's start each of the eight would share a page with each neighbour: 16 cuMemCreate (an
// inner page and a one-page last page each). On page boundaries: 8, and no page more.
TEST_F(AlignedPlacementTest, WholePageBlocksAfterAnOddOneTakeOneHandleEach) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  void* odd = alloc_->allocate(2 * P + P / 2, nullptr);
  const core::DeviceStats before = alloc_->stats();
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc_->allocate(2 * P, nullptr));
  ASSERT_EQ(books_vs_driver(), "");
  const core::DeviceStats after = alloc_->stats();
  const uint64_t creates = calls(after, EntryPoint::mem_create) - calls(before, EntryPoint::mem_create);
  std::printf("8 blocks of 2 pages after one of 2.5: cuMemCreate %llu, cuMemSetAccess %llu, "
              "modeled %.3f ms\n",
              static_cast<unsigned long long>(creates),
              static_cast<unsigned long long>(calls(after, EntryPoint::mem_set_access) -
                                              calls(before, EntryPoint::mem_set_access)),
              (after.modeled_driver_ns - before.modeled_driver_ns) * 1e-6);
  EXPECT_EQ(creates, 8u) << "one handle per block of whole pages";
  for (void* b : blocks) EXPECT_EQ(addr(b) % P, 0u) << "on a page boundary";
  EXPECT_EQ(addr(blocks[0]), addr(odd) + 3 * P) << "the first boundary after the odd block";
  EXPECT_EQ(after.mapped_bytes, 19 * P) << "3 pages for the odd block, 16 for the others";
  for (void* b : blocks) alloc_->deallocate(b, nullptr);
  alloc_->deallocate(odd, nullptr);
}

// A block of one page needs one new handle wherever it starts, and one of other sizes ends inside
// a page wherever it starts: both take the free block's start, sharing the odd block's last page.
TEST_F(AlignedPlacementTest, OnePageAndOddBlocksKeepTheStart) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  void* odd = alloc_->allocate(2 * P + P / 2, nullptr);
  void* one = alloc_->allocate(P, nullptr);
  EXPECT_EQ(addr(one), addr(odd) + 2 * P + P / 2);
  void* other = alloc_->allocate(3 * P + 512, nullptr);
  EXPECT_EQ(addr(other), addr(one) + P);
  EXPECT_EQ(alloc_->stats().mapped_bytes, 7 * P) << "no page more than the blocks touch";
  alloc_->deallocate(other, nullptr);
  alloc_->deallocate(one, nullptr);
  alloc_->deallocate(odd, nullptr);
}

// Where the pages are mapped, nothing is created either way: a block of whole pages placed in
// freed memory keeps the free block's start, so placements in cached memory are what they were.
TEST_F(AlignedPlacementTest, MappedMemoryKeepsTheStart) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  void* odd = alloc_->allocate(2 * P + P / 2, nullptr);
  void* mid = alloc_->allocate(5 * P + P / 2, nullptr);  // not whole pages: at the start
  ASSERT_EQ(addr(mid), addr(odd) + 2 * P + P / 2);
  void* guard = alloc_->allocate(2 * P + P / 2, nullptr);
  alloc_->deallocate(mid, nullptr);
  const core::DeviceStats before = alloc_->stats();
  void* w = alloc_->allocate(4 * P, nullptr);
  EXPECT_EQ(addr(w), addr(odd) + 2 * P + P / 2) << "on the mapped pages at the free block's start";
  EXPECT_EQ(alloc_->stats().mapped_bytes, before.mapped_bytes) << "no page created";
  ASSERT_EQ(books_vs_driver(), "");
  alloc_->deallocate(w, nullptr);
  alloc_->deallocate(guard, nullptr);
  alloc_->deallocate(odd, nullptr);
}

}  // namespace
}  // namespace expanse::test
