// Driver failures at chosen points of a request, a trim or a fence, and requests that cannot
// succeed: each leaves the books exact (they match the driver) and later requests work.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

namespace expanse::test {
namespace {

using driver::EntryPoint;

class FailureRecoveryTest : public CoreTest {};

// A request creates pages, then fails (here: the 2nd cuMemCreate; the second request starts in
// the first one's last page and ends mid-page, so it needs two new handles: its inner pages and
// its last page) and parks them in the pool: physical_bytes grows, and its peak with it
// (docs/design.md, invariant 5).
TEST_F(FailureRecoveryTest, PeakPhysicalCoversPagesCreatedForAFailedRequest) {
  make(sim_config(1 * GiB));
  void* a = alloc_->allocate(601 * MiB, nullptr);
  sim::inject_failure(EntryPoint::mem_create, 2, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->allocate(100 * MiB + 512, nullptr), driver_failure);
  core::DeviceStats st = alloc_->stats();
  EXPECT_GT(st.pooled_bytes, 0u) << "the failed request created pages and kept them";
  EXPECT_GE(st.peak_physical_bytes, st.physical_bytes)
      << "peak physical " << st.peak_physical_bytes << " < physical " << st.physical_bytes;
  alloc_->deallocate(a, nullptr);
}

// cuMemMap fails on the 2nd handle of a request and undoing the 1st handle's mapping fails too.
// The 1st stays mapped (the books say so) without access (cuMemSetAccess runs only after all
// maps): the next block placed there must grant it access before handing the memory out.
TEST_F(FailureRecoveryTest, MapFailureWhoseUndoFailsLeavesNoInaccessibleMappedPage) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  sim::inject_failure(EntryPoint::mem_map, 2, CUDA_ERROR_UNKNOWN);
  sim::inject_failure(EntryPoint::mem_unmap, 1, CUDA_ERROR_UNKNOWN);
  // 2 pages and a bit: a 2-page handle and a 1-page one, so two cuMemMap calls.
  EXPECT_THROW(alloc_->allocate(2 * P + 512, nullptr), driver_failure);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  void* p = alloc_->allocate(2 * P + 512, nullptr);
  const auto base = reinterpret_cast<CUdeviceptr>(p);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(access_at(base + i * P), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        << "page " << i << " of a live block is not accessible";
  }
  alloc_->deallocate(p, nullptr);
}

// Same, with cuMemSetAccess failing and the undo's cuMemUnmap failing.
TEST_F(FailureRecoveryTest, SetAccessFailureWhoseUndoFailsLeavesNoInaccessibleMappedPage) {
  make(sim_config(1 * GiB));
  const size_t P = alloc_->page_size();
  sim::inject_failure(EntryPoint::mem_set_access, 1, CUDA_ERROR_UNKNOWN);
  sim::inject_failure(EntryPoint::mem_unmap, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->allocate(P, nullptr), driver_failure);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  void* p = alloc_->allocate(P, nullptr);
  EXPECT_EQ(access_at(reinterpret_cast<CUdeviceptr>(p)), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      << "a live block's page is mapped without access";
  alloc_->deallocate(p, nullptr);
}

// A request larger than the whole device can never succeed: it fails at once, without reserving
// VA, creating pages, unmapping the cache or waiting for streams.
TEST_F(FailureRecoveryTest, HopelessRequestLeavesTheCacheAlone) {
  make(sim_config(1 * GiB));
  void* a = alloc_->allocate(512 * MiB, nullptr);
  alloc_->deallocate(a, nullptr);
  core::DeviceStats before = alloc_->stats();
  EXPECT_THROW(alloc_->allocate(2 * GiB, nullptr), out_of_memory);
  core::DeviceStats after = alloc_->stats();
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes) << "the cache was unmapped for nothing";
  EXPECT_EQ(after.physical_bytes, before.physical_bytes) << "pages created for nothing";
  EXPECT_EQ(after.va_reserved_bytes, before.va_reserved_bytes) << "VA reserved for nothing";
}

// cuMemUnmap fails on the 2nd run of a reclaim: the 1st run's pages are in the pool, the books
// match the driver, the request fails with a driver error and the next one works.
TEST_F(FailureRecoveryTest, UnmapFailingMidReclaimKeepsBooksExact) {
  make(sim_config(256 * MiB));
  std::vector<void*> v;
  for (int i = 0; i < 8; ++i) v.push_back(alloc_->allocate(32 * MiB, nullptr));
  alloc_->deallocate(v[1], nullptr);
  alloc_->deallocate(v[5], nullptr);
  alloc_->release_cached();  // gives the freed pages back; 6 blocks stay live
  void* w = alloc_->allocate(32 * MiB, nullptr);
  void* x = alloc_->allocate(32 * MiB, nullptr);  // device full now
  alloc_->deallocate(w, nullptr);
  alloc_->deallocate(x, nullptr);
  alloc_->release_cached();
  // Re-cache two separate ranges: mapped, free, not adjacent.
  w = alloc_->allocate(32 * MiB, nullptr);
  x = alloc_->allocate(32 * MiB, nullptr);
  alloc_->deallocate(w, nullptr);
  alloc_->deallocate(x, nullptr);
  sim::inject_failure(EntryPoint::mem_unmap, 2, CUDA_ERROR_UNKNOWN);
  try {
    void* big = alloc_->allocate(64 * MiB + 1, nullptr);
    alloc_->deallocate(big, nullptr);
  } catch (const driver_failure&) {
  } catch (const out_of_memory&) {
  }
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->release_cached();
  void* y = alloc_->allocate(64 * MiB, nullptr);
  alloc_->deallocate(y, nullptr);
  for (void* p : v) {
    if (alloc_->owns(p)) alloc_->deallocate(p, nullptr);
  }
  alloc_->release_cached();
  EXPECT_EQ(books_vs_driver(), "");
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
}

// cuMemRelease fails while release_cached trims: the handle stays pooled, books exact.
TEST_F(FailureRecoveryTest, ReleaseFailingInTrimKeepsBooksExact) {
  make(sim_config(1 * GiB));
  void* a = alloc_->allocate(64 * MiB, nullptr);  // one 32-page handle
  alloc_->deallocate(a, nullptr);
  sim::inject_failure(EntryPoint::mem_release, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->release_cached(), driver_failure);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");
}

// cuEventRecord fails for a fence while the memory is needed: nothing is inferred from the error
// (the request neither fails nor reuses the memory unproven); the allocator records a fence again
// (or, waiting, syncs the stream's context), and the books stay exact.
TEST_F(FailureRecoveryTest, EventRecordFailingInPollIsNotAFailureNorAProof) {
  core::AllocatorOptions o;
  o.lifo_depth = 0;
  make(sim_config(256 * MiB), o);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(200 * MiB, s1);
  alloc_->deallocate(a, s1);
  sim::inject_failure(EntryPoint::event_record, 1, CUDA_ERROR_UNKNOWN);
  const uint64_t records = sim::call_count(EntryPoint::event_record);
  const uint64_t ctx_syncs = sim::call_count(EntryPoint::ctx_synchronize);
  void* b = alloc_->allocate(200 * MiB, s2);
  ASSERT_NE(b, nullptr);
  // s1 is not touched from s2's call (its handle may be dead): the wait is a context sync.
  EXPECT_GE(sim::call_count(EntryPoint::event_record), records);
  EXPECT_GT(sim::call_count(EntryPoint::ctx_synchronize), ctx_syncs);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->deallocate(b, s2);
}

// cuMemAddressReserve fails: the request fails, no VA or page is held for it, later ones work.
TEST_F(FailureRecoveryTest, ReserveFailingKeepsBooksExact) {
  make(sim_config(1 * GiB));
  sim::inject_failure(EntryPoint::mem_address_reserve, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->allocate(4 * MiB, nullptr), driver_failure);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  EXPECT_EQ(alloc_->stats().va_reserved_bytes, 0u);
  void* p = alloc_->allocate(4 * MiB, nullptr);
  alloc_->deallocate(p, nullptr);
}

}  // namespace
}  // namespace expanse::test
