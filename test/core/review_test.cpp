// Review tests for the core allocator: stream-ordered safety checked by an oracle, failure paths,
// accounting corners. Tests marked "Was a bug" pin bugs this review found, now fixed; the
// others pin down behaviour that was checked and found correct.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"
#include "reference_model.hpp"

#include <map>
#include <random>

namespace expanse::test {
namespace {

using driver::EntryPoint;

class ReviewTest : public CoreTest {
 protected:
  // Makes device 0's primary context current on this thread for the scope (the test's own driver
  // calls: oracle events, handle and access queries).
  struct Ctx {
    explicit Ctx(const driver::DriverTable& t) : t_(t) {
      t_.device_get(&dev_, 0);
      t_.device_primary_ctx_retain(&ctx_, dev_);
      t_.ctx_push_current(ctx_);
    }
    ~Ctx() {
      CUcontext popped = nullptr;
      t_.ctx_pop_current(&popped);
      t_.device_primary_ctx_release(dev_);
    }
    const driver::DriverTable& t_;
    CUdevice dev_ = 0;
    CUcontext ctx_ = nullptr;
  };

  // Access flags of device 0 at ptr; -1 when nothing is mapped there.
  int access_at(CUdeviceptr ptr) {
    Ctx c(drv_->table());
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    unsigned long long flags = 0;
    if (drv_->table().mem_get_access(&flags, &loc, ptr) != CUDA_SUCCESS) return -1;
    return static_cast<int>(flags);
  }

  // Handle mapped at ptr, 0 when none.
  CUmemGenericAllocationHandle handle_at(CUdeviceptr ptr) {
    CUmemGenericAllocationHandle h = 0;
    if (drv_->table().mem_retain_allocation_handle(&h, reinterpret_cast<void*>(ptr)) !=
        CUDA_SUCCESS) {
      return 0;
    }
    drv_->table().mem_release(h);
    return h;
  }
};

bool overlaps(uintptr_t x, size_t xn, uintptr_t y, size_t yn) { return x < y + yn && y < x + xn; }

// ---- invariant 3 under an oracle -------------------------------------------------------------
//
// Before every free, the test records its own event on every stream that may still use the block
// (the freeing stream, the allocating stream, record_stream users). Until those events complete
// (a held stream's work completes on release or when someone synchronizes on it):
//   - an allocation on stream T may overlap the block only if every such event on a stream other
//     than T is complete;
//   - every page under the block stays mapped with the same handle.
// Random operations over a small device, with limits, release_cached, release_threshold, LIFO
// depths and held streams; the reference model checks invariant 1 both ways.
struct OracleParams {
  size_t capacity;
  size_t lifo_depth;
  size_t release_threshold;
  bool reclaim_first;
  uint64_t seed;
  size_t va_budget = 0;
};

class ReviewOracleTest : public ReviewTest, public ::testing::WithParamInterface<OracleParams> {};

TEST_P(ReviewOracleTest, StreamOrderedReuseAndUnmapNeverBeatPendingWork) {
  const OracleParams prm = GetParam();
  core::AllocatorOptions opts;
  opts.lifo_depth = prm.lifo_depth;
  opts.release_threshold = prm.release_threshold;
  opts.reclaim_before_create = prm.reclaim_first;
  opts.va_budget = prm.va_budget;
  make(sim_config(prm.capacity), opts);
  const size_t P = alloc_->page_size();
  ReferenceModel model(P, prm.capacity);
  std::vector<CUstream> streams = {nullptr, new_stream(), new_stream(), new_stream()};
  std::mt19937_64 rng(prm.seed);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  const auto& t = drv_->table();
  Ctx ctx(t);

  struct Freed {
    uintptr_t addr;
    size_t size;
    std::vector<std::pair<CUstream, CUevent>> events;
    std::map<uintptr_t, CUmemGenericAllocationHandle> pages;
  };
  std::vector<Freed> freed;
  std::vector<CUevent> spare;
  std::map<uintptr_t, std::vector<CUstream>> users;  // live block -> streams that used it
  auto new_event = [&]() {
    if (!spare.empty()) {
      CUevent e = spare.back();
      spare.pop_back();
      return e;
    }
    CUevent e = nullptr;
    EXPECT_EQ(t.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    return e;
  };
  auto done = [&](CUevent e) { return t.event_query(e) == CUDA_SUCCESS; };

  const size_t ops = 20000;
  size_t n_alloc = 0, n_oom = 0, n_same_stream_reuse = 0, n_pending_pages = 0;
  for (size_t step = 0; step < ops; ++step) {
    // Forget freed blocks whose work is all complete.
    for (size_t i = 0; i < freed.size();) {
      bool all = true;
      for (auto& [s, e] : freed[i].events) all = all && done(e);
      if (all) {
        for (auto& [s, e] : freed[i].events) spare.push_back(e);
        freed[i] = std::move(freed.back());
        freed.pop_back();
      } else {
        ++i;
      }
    }
    const size_t dice = pick(1000);
    if (dice < 450 || model.live().empty()) {
      size_t n;
      if (pick(20) == 0) {
        n = P + rng() % (prm.capacity / 2);
      } else {
        n = log_uniform_size(rng, 23);
      }
      CUstream s = streams[pick(streams.size())];
      const size_t avail = model.avail();
      void* p = nullptr;
      try {
        p = alloc_->allocate(n, s);
      } catch (const out_of_memory& e) {
        ASSERT_GT(model.pages_for(n), avail) << "step " << step << ": " << e.what();
        model.oom();
        ++n_oom;
      }
      if (p != nullptr) {
        auto a = reinterpret_cast<uintptr_t>(p);
        size_t sz = (n + 511) / 512 * 512;
        ASSERT_EQ(model.placement_error(a, sz, avail), "") << "step " << step << ": " << p;
        for (const Freed& f : freed) {
          if (!overlaps(a, sz, f.addr, f.size)) continue;
          ++n_same_stream_reuse;
          for (auto& [fs, e] : f.events) {
            ASSERT_TRUE(fs == s || done(e))
                << "step " << step << ": block " << p << " handed to stream " << s
                << " overlaps memory freed at " << reinterpret_cast<void*>(f.addr)
                << " whose work on stream " << fs << " is still pending";
          }
        }
        fill_pattern(p, n, step);
        model.add(a, ModelBlock{n, sz, s, step});
        users[a] = {s};
        ++n_alloc;
      }
    } else if (dice < 800) {
      auto it = model.live().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(model.live().size())));
      const uintptr_t a = it->first;
      const size_t sz = it->second.size;
      CUstream s = pick(4) == 0 ? streams[pick(streams.size())] : it->second.stream;
      Freed f{a, sz, {}, {}};
      std::vector<CUstream> us = users[a];
      if (std::find(us.begin(), us.end(), s) == us.end()) us.push_back(s);
      for (CUstream u : us) {
        CUevent e = new_event();
        ASSERT_EQ(t.event_record(e, u), CUDA_SUCCESS);
        f.events.emplace_back(u, e);
      }
      for (uintptr_t pg = a / P * P; pg < a + sz; pg += P) f.pages[pg] = handle_at(pg);
      alloc_->deallocate(reinterpret_cast<void*>(a), s);
      model.remove(a);
      users.erase(a);
      freed.push_back(std::move(f));
    } else if (dice < 860) {
      auto it = model.live().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(model.live().size())));
      CUstream u = streams[pick(streams.size())];
      alloc_->record_stream(reinterpret_cast<void*>(it->first), u);
      auto& v = users[it->first];
      if (std::find(v.begin(), v.end(), u) == v.end()) v.push_back(u);
    } else if (dice < 920) {
      sim::hold_stream(streams[pick(streams.size())]);
    } else if (dice < 975) {
      sim::release_stream(streams[pick(streams.size())]);
    } else if (dice < 985) {
      alloc_->release_cached();
    } else {
      size_t lim = pick(2) == 0 ? SIZE_MAX : (prm.capacity / 4) + pick(prm.capacity / P) * P;
      alloc_->set_limit(lim);
      model.set_limit(lim);
    }

    // Pages under memory whose work is pending stay mapped, with the same handle (memory whose
    // work the allocator waited for during this step is exempt).
    for (const Freed& f : freed) {
      bool all = true;
      for (auto& [s, e] : f.events) all = all && done(e);
      if (all) continue;
      n_pending_pages += f.pages.size();
      for (const auto& [pg, h] : f.pages) {
        ASSERT_EQ(handle_at(pg), h) << "step " << step << ": page " << reinterpret_cast<void*>(pg)
                                    << " under memory freed at "
                                    << reinterpret_cast<void*>(f.addr)
                                    << " was unmapped while work on it was pending";
      }
    }
    core::DeviceStats st = alloc_->stats();
    ASSERT_EQ(st.allocated_bytes, model.allocated());
    ASSERT_EQ(st.touched_bytes, model.touched() * P) << "step " << step;
    if (step % 64 == 0) {
      ASSERT_EQ(books_vs_driver(), "") << "step " << step;
    }
    for (const auto& [a, b] : model.live()) {
      ASSERT_EQ(check_pattern(reinterpret_cast<void*>(a), b.requested, b.seed, 3), SIZE_MAX)
          << "step " << step;
    }
  }
  for (const auto& [a, b] : model.live()) alloc_->deallocate(reinterpret_cast<void*>(a), b.stream);
  for (CUstream s : streams) sim::release_stream(s);
  for (Freed& f : freed) {
    for (auto& [s, e] : f.events) spare.push_back(e);
  }
  for (CUevent e : spare) t.event_destroy(e);
  EXPECT_GT(n_oom, 0u);
  EXPECT_GT(n_alloc, ops / 5);
  EXPECT_GT(n_same_stream_reuse, 0u) << "the oracle never saw memory reused under pending work";
  EXPECT_GT(n_pending_pages, 0u);
  std::printf("allocs %zu, ooms %zu, reuses of memory with work pending %zu, pending page checks %zu\n",
              n_alloc, n_oom, n_same_stream_reuse, n_pending_pages);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ReviewOracleTest,
    ::testing::Values(OracleParams{256 * MiB, 16, core::kNoLimit, false, 1},
                      OracleParams{256 * MiB, 0, core::kNoLimit, false, 2},
                      OracleParams{256 * MiB, 4, 16 * MiB, false, 3},
                      OracleParams{256 * MiB, 2, core::kNoLimit, true, 4},
                      OracleParams{64 * MiB, 1, 8 * MiB, true, 5},
                      OracleParams{1 * GiB, 16, core::kNoLimit, false, 6},
                      OracleParams{256 * MiB, 16, core::kNoLimit, false, 7, 2 * GiB},
                      OracleParams{256 * MiB, 4, core::kNoLimit, true, 8, 1536 * MiB}),
    [](const ::testing::TestParamInfo<OracleParams>& p) {
      return "seed" + std::to_string(p.param.seed);
    });

// ---- bugs ------------------------------------------------------------------------------------

// Was a bug (invariant 5, peaks): ensure_pages() creates pages, then fails (here: the 2nd
// cuMemCreate; the second request starts mid-page, so it needs three handles: its first page,
// its inner pages, its last page) and parks them in the pool; physical_bytes grows, so the peak
// must too.
TEST_F(ReviewTest, PeakPhysicalCoversPagesCreatedForAFailedRequest) {
  make(sim_config(1 * GiB));
  void* a = alloc_->allocate(601 * MiB, nullptr);
  sim::inject_failure(EntryPoint::mem_create, 2, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->allocate(100 * MiB, nullptr), driver_failure);
  core::DeviceStats st = alloc_->stats();
  EXPECT_GT(st.pooled_bytes, 0u) << "the failed request created pages and kept them";
  EXPECT_GE(st.peak_physical_bytes, st.physical_bytes)
      << "peak physical " << st.peak_physical_bytes << " < physical " << st.physical_bytes;
  alloc_->deallocate(a, nullptr);
}

// Was a bug (invariants 2/4): cuMemMap fails on the 2nd page of a request and undoing the 1st page's
// mapping fails too. The 1st page stays mapped (the books say so, rightly) but was never granted
// access (cuMemSetAccess runs only after all maps). The next block placed there sees the page as
// mapped, grants access only to the pages it maps itself, and hands out memory that faults.
TEST_F(ReviewTest, MapFailureWhoseUndoFailsLeavesNoInaccessibleMappedPage) {
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
TEST_F(ReviewTest, SetAccessFailureWhoseUndoFailsLeavesNoInaccessibleMappedPage) {
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

// Was a bug (invariant 4, "later requests work"): memory freed on a stream gets its fence lazily, in
// poll(). When the application destroys the stream after the free (legal: cudaFreeAsync then
// cudaStreamDestroy), every later poll() records an event on a dead stream, fails, and throws —
// every allocation that needs poll() and every release_cached() fail from then on.
TEST_F(ReviewTest, DestroyingAStreamAfterFreeingOnItDoesNotBreakTheAllocator) {
  core::AllocatorOptions o;
  o.lifo_depth = 0;  // the freed block goes straight to the index, owned by s1
  make(sim_config(1 * GiB), o);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(64 * MiB, s1);
  alloc_->deallocate(a, s1);
  ASSERT_EQ(drv_->table().stream_destroy(s1), CUDA_SUCCESS);
  streams_.erase(std::find(streams_.begin(), streams_.end(), s1));
  for (int i = 0; i < 3; ++i) {
    void* b = nullptr;
    EXPECT_NO_THROW(b = alloc_->allocate(128 * MiB, s2)) << "attempt " << i;
    alloc_->deallocate(b, s2);
  }
  EXPECT_NO_THROW(alloc_->release_cached());
}

// Was a bug (same root cause, record_stream): a block used on a stream that is destroyed before the free
// can never be freed — deallocate() records an event on the dead stream and throws every time.
TEST_F(ReviewTest, FreeAfterTheRecordedStreamWasDestroyedSucceeds) {
  make(sim_config(1 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(4 * MiB, s1);
  alloc_->record_stream(a, s2);
  ASSERT_EQ(drv_->table().stream_destroy(s2), CUDA_SUCCESS);
  streams_.erase(std::find(streams_.begin(), streams_.end(), s2));
  EXPECT_NO_THROW(alloc_->deallocate(a, s1));
  // (While the bug stands the block stays live; the allocator's destructor gives it back.)
}

// Was a bug (design): a request larger than the whole device can never succeed, yet it reserves VA for
// itself, creates every page the device has left, unmaps the whole cache into the pool and
// synchronizes every stream before saying OOM. capacity_pages_ is computed and never used; an
// early "untouched pages > capacity - touched" check (like the one for the limit) avoids it.
TEST_F(ReviewTest, HopelessRequestLeavesTheCacheAlone) {
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

// ---- failure paths checked and found correct ---------------------------------------------------

// cuMemUnmap fails on the 2nd run of a reclaim: the 1st run's pages are in the pool, the books
// match the driver, the request fails with a driver error and the next one works.
TEST_F(ReviewTest, UnmapFailingMidReclaimKeepsBooksExact) {
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

// cuMemRelease fails in trim_to (release_cached): the handle stays pooled, books exact.
TEST_F(ReviewTest, ReleaseFailingInTrimKeepsBooksExact) {
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

// cuEventRecord fails for a fence inside poll(): the request fails cleanly, nothing leaks, the
// memory becomes usable by other streams once the driver works again.
// cuEventRecord fails while the memory is needed: nothing is inferred from the error (the
// request neither fails nor reuses the memory unproven); the allocator records a fence again
// (or, waiting, syncs the stream's context), and the books stay exact.
TEST_F(ReviewTest, EventRecordFailingInPollIsNotAFailureNorAProof) {
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
TEST_F(ReviewTest, ReserveFailingKeepsBooksExact) {
  make(sim_config(1 * GiB));
  sim::inject_failure(EntryPoint::mem_address_reserve, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_THROW(alloc_->allocate(4 * MiB, nullptr), driver_failure);
  sim::clear_injections();
  EXPECT_EQ(books_vs_driver(), "");
  EXPECT_EQ(alloc_->stats().va_reserved_bytes, 0u);
  void* p = alloc_->allocate(4 * MiB, nullptr);
  alloc_->deallocate(p, nullptr);
}

// record_stream + free on a third stream: the memory waits for all three.
TEST_F(ReviewTest, RecordStreamAndFreeOnAThirdStreamWaitsForAll) {
  make(sim_config(1 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream(), s3 = new_stream();
  void* a = alloc_->allocate(8 * MiB, s1);
  alloc_->record_stream(a, s2);
  sim::hold_stream(s2);
  alloc_->deallocate(a, s3);
  for (CUstream s : {s1, s3}) {
    void* b = alloc_->allocate(8 * MiB, s);
    EXPECT_FALSE(overlaps(reinterpret_cast<uintptr_t>(a), 8 * MiB, reinterpret_cast<uintptr_t>(b),
                          8 * MiB));
    alloc_->deallocate(b, s);
  }
  sim::release_stream(s2);
}

// Safe memory merged into a block owned by a held stream becomes owned by it (conservative), and
// a later wait-for-all (release_cached) still makes everything safe and trims to live pages.
TEST_F(ReviewTest, SafeMemoryMergedIntoAnOwnedBlockIsReleasedAfterWaiting) {
  core::AllocatorOptions o;
  o.lifo_depth = 0;
  make(sim_config(1 * GiB), o);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(64 * MiB, s1);
  void* b = alloc_->allocate(64 * MiB, s2);
  void* c = alloc_->allocate(64 * MiB, s1);
  sim::hold_stream(s1);
  sim::hold_stream(s2);
  alloc_->deallocate(b, s2);
  alloc_->deallocate(a, s1);
  alloc_->deallocate(c, s1);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(books_vs_driver(), "");
  sim::release_stream(s1);
  sim::release_stream(s2);
}

}  // namespace
}  // namespace expanse::test
