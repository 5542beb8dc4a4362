// The reservation: memory taken up front, held against other processes, kept by release_cached
// and trimming, given back by unreserve, and serving any workload that fits without cuMemCreate.
// "Another process" is a second allocator on the same sim device: the sim's cuMemGetInfo counts
// both, as the real driver counts every process.
#include "conf/config.hpp"
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <functional>
#include <random>

namespace expanse::test {
namespace {

using driver::EntryPoint;

class ReserveTest : public CoreTest {
 protected:
  void TearDown() override {
    other_.reset();
    CoreTest::TearDown();
  }

  static core::AllocatorOptions conf_opts(const std::string& text, size_t capacity) {
    return conf::options_for_device(conf::parse_config(text), capacity);
  }

  // What the sim's cuMemGetInfo says is free on device 0.
  size_t sim_free() {
    PrimaryCtx c(drv_->table());
    size_t f = 0, t = 0;
    EXPECT_EQ(drv_->table().mem_get_info(&f, &t), CUDA_SUCCESS);
    return f;
  }

  // Another allocator on the same device: another process, as far as device memory goes.
  core::DeviceAllocator& other(const core::AllocatorOptions& opts = {}) {
    other_ = std::make_unique<core::DeviceAllocator>(*drv_, 0, opts);
    return *other_;
  }

  // A mixed workload (small blocks, KV-cache-like blocks, large ones, frees out of order) whose
  // live blocks stay under `budget` bytes; frees everything at the end, or hands the live blocks
  // to `keep`. Checks the books against the driver along the way, and `each` after every step.
  void mixed_workload(size_t budget, uint64_t seed, int steps = 3000,
                      std::vector<std::pair<void*, size_t>>* keep = nullptr,
                      const std::function<void()>& each = {}) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<void*, size_t>> live;
    size_t live_bytes = 0;
    auto size_of = [&]() -> size_t {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 5) return 512 + rng() % (1 * MiB);
      if (kind < 9) return 2 * MiB + rng() % (48 * MiB);
      return 64 * MiB + rng() % (400 * MiB);
    };
    for (int i = 0; i < steps; ++i) {
      const bool grow = live.empty() || rng() % 100 < 55;
      if (grow) {
        const size_t n = size_of();
        // Edge pages: a block may touch two pages more than its size.
        if (live_bytes + n + 4 * MiB * (live.size() + 1) > budget) continue;
        void* p = alloc_->allocate(n, nullptr);
        ASSERT_NE(p, nullptr);
        live.emplace_back(p, n);
        live_bytes += n;
      } else {
        const size_t k = rng() % live.size();
        alloc_->deallocate(live[k].first, nullptr);
        live_bytes -= live[k].second;
        live[k] = live.back();
        live.pop_back();
      }
      if (i % 500 == 0) {
        ASSERT_EQ(books_vs_driver(), "");
      }
      if (each) each();
    }
    if (keep != nullptr) {
      *keep = std::move(live);
      return;
    }
    for (auto& [p, n] : live) alloc_->deallocate(p, nullptr);
  }

  // What the driver did for one run: a mixed workload under `conf` on kDevice-sized device, from
  // the first allocation on (the reservation made), then one block of all the pages its live
  // blocks leave but `spare`.
  struct Figures {
    uint64_t creates = 0, releases = 0, maps = 0;  // the workload and the block
    double request_ns = 0;                        // the block's modeled driver time
    uint64_t request_creates = 0, request_maps = 0;
  };
  Figures mixed_then_large(const std::string& conf, uint64_t seed, size_t spare);

  static uint64_t vmm_calls(EntryPoint e) { return sim::call_count(e); }

  std::unique_ptr<core::DeviceAllocator> other_;
};

constexpr size_t kDevice = 8 * GiB;

ReserveTest::Figures ReserveTest::mixed_then_large(const std::string& conf, uint64_t seed,
                                                   size_t spare) {
  make(sim_config(kDevice), conf_opts(conf, kDevice));
  alloc_->deallocate(alloc_->allocate(512, nullptr), nullptr);
  const uint64_t c0 = vmm_calls(EntryPoint::mem_create), r0 = vmm_calls(EntryPoint::mem_release),
                 m0 = vmm_calls(EntryPoint::mem_map);
  std::vector<std::pair<void*, size_t>> live;
  mixed_workload(kDevice * 3 / 4, seed, 3000, &live);
  // The block: every page the live blocks leave, but `spare`.
  const size_t size = kDevice - alloc_->stats().touched_bytes - spare;
  const core::DeviceStats before = alloc_->stats();
  const uint64_t rc0 = vmm_calls(EntryPoint::mem_create), rm0 = vmm_calls(EntryPoint::mem_map);
  void* big = alloc_->allocate(size, nullptr);
  Figures f;
  f.request_ns = alloc_->stats().modeled_driver_ns - before.modeled_driver_ns;
  f.request_creates = vmm_calls(EntryPoint::mem_create) - rc0;
  f.request_maps = vmm_calls(EntryPoint::mem_map) - rm0;
  f.creates = vmm_calls(EntryPoint::mem_create) - c0;
  f.releases = vmm_calls(EntryPoint::mem_release) - r0;
  f.maps = vmm_calls(EntryPoint::mem_map) - m0;
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->deallocate(big, nullptr);
  for (auto& [p, n] : live) alloc_->deallocate(p, nullptr);
  return f;
}

TEST_F(ReserveTest, FractionHoldsThatMuchRightAfterTheFirstAllocation) {
  make(sim_config(kDevice), conf_opts("reserve:0.9", kDevice));
  EXPECT_EQ(sim_free(), kDevice);  // nothing taken before the device's first use
  void* p = alloc_->allocate(1 * MiB, nullptr);
  const size_t want = static_cast<size_t>(0.9 * static_cast<double>(kDevice)) / (2 * MiB) * 2 * MiB;
  EXPECT_EQ(sim_free(), kDevice - want);
  const core::DeviceStats s = alloc_->stats();
  EXPECT_EQ(s.reserved_bytes, want);
  EXPECT_EQ(s.reserve_asked_bytes, want);
  EXPECT_EQ(s.physical_bytes, want);
  EXPECT_EQ(s.reserved_unused_bytes, want - 2 * MiB);  // the small block touches one page
  alloc_->deallocate(p, nullptr);
}

// One-page reserved handles are never reshaped: any slot takes them as they are.
TEST_F(ReserveTest, OnePageHandlesServeAWorkloadThatFitsWithNoCuMemCreate) {
  make(sim_config(kDevice), conf_opts("reserve:0.9,reserve_handle_size:2MiB", kDevice));
  alloc_->deallocate(alloc_->allocate(512, nullptr), nullptr);  // first use: the reservation
  const size_t reserved = alloc_->stats().reserved_bytes;
  const uint64_t creates = sim::call_count(EntryPoint::mem_create);
  const uint64_t releases = sim::call_count(EntryPoint::mem_release);
  mixed_workload(reserved, 7);
  // Then one block of almost all of it, after the fragmentation.
  void* big = alloc_->allocate(reserved - 4 * MiB, nullptr);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_create), creates);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_release), releases);
  EXPECT_EQ(books_vs_driver(), "");
  alloc_->deallocate(big, nullptr);
}

// Large reserved handles (the default) are reshaped into the handles blocks ask for: that takes
// nothing beyond the reservation (other processes keep what it leaves them), holds it whole after
// every call, and a repeat of the workload maps and creates nothing. (A workload of live blocks up
// to the whole reservation moves pages in every repeat, with a reservation or a limit alike.)
TEST_F(ReserveTest, AWorkloadThatFitsTakesNothingBeyondItAndSettles) {
  make(sim_config(kDevice), conf_opts("reserve:0.9", kDevice));
  alloc_->deallocate(alloc_->allocate(512, nullptr), nullptr);
  const size_t reserved = alloc_->stats().reserved_bytes;
  const size_t free_after = sim_free();
  EXPECT_EQ(free_after, kDevice - reserved);
  size_t steps = 0;
  auto whole = [&] {
    ++steps;
    ASSERT_EQ(alloc_->stats().physical_bytes, reserved) << "step " << steps;
    ASSERT_EQ(sim_free(), free_after) << "step " << steps;
  };
  mixed_workload(reserved * 3 / 4, 7, 3000, nullptr, whole);
  EXPECT_GT(vmm_calls(EntryPoint::mem_create), 0u);  // the reservation was reshaped
  // Settled by the third repetition, as any repeated workload (repeated_workload_test.cpp).
  mixed_workload(reserved * 3 / 4, 7, 3000, nullptr, whole);
  const uint64_t creates = vmm_calls(EntryPoint::mem_create);
  const uint64_t maps = vmm_calls(EntryPoint::mem_map);
  mixed_workload(reserved * 3 / 4, 7, 3000, nullptr, whole);
  EXPECT_EQ(vmm_calls(EntryPoint::mem_create), creates);
  EXPECT_EQ(vmm_calls(EntryPoint::mem_map), maps);
  EXPECT_EQ(books_vs_driver(), "");
}

// Reserved memory freed on one stream and not yet proven done serves another stream's request
// after a wait, not by creating memory beyond the reservation.
TEST_F(ReserveTest, ACoveredRequestWaitsForFreedReservedMemoryRatherThanCreating) {
  make(sim_config(kDevice));
  alloc_->reserve(4 * GiB);
  CUstream a = new_stream(), b = new_stream();
  void* p = alloc_->allocate(3 * GiB, a);
  alloc_->deallocate(p, a);
  const uint64_t creates = sim::call_count(EntryPoint::mem_create);
  void* q = alloc_->allocate(3 * GiB, b);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_create), creates);
  EXPECT_EQ(alloc_->stats().physical_bytes, 4 * GiB);
  EXPECT_EQ(sim_free(), kDevice - 4 * GiB);
  alloc_->deallocate(q, b);
}

TEST_F(ReserveTest, AnotherAllocatorOnTheDeviceCannotTakeIt) {
  make(sim_config(kDevice), conf_opts("reserve:0.9", kDevice));
  alloc_->deallocate(alloc_->allocate(512, nullptr), nullptr);
  core::DeviceAllocator& b = other();
  EXPECT_THROW(b.allocate(1 * GiB, nullptr), out_of_memory);
  void* q = b.allocate(512 * MiB, nullptr);  // what is left beside the reservation
  EXPECT_NE(q, nullptr);
  // The reservation still serves its own: all but the page the small block took.
  void* p = alloc_->allocate(alloc_->stats().reserved_bytes - 4 * MiB, nullptr);
  EXPECT_NE(p, nullptr);
  alloc_->deallocate(p, nullptr);
  b.deallocate(q, nullptr);
}

TEST_F(ReserveTest, ReleaseCachedAndTrimmingKeepIt) {
  make(sim_config(kDevice), conf_opts("reserve:4GiB,release_threshold:0", kDevice));
  void* p = alloc_->allocate(3 * GiB, nullptr);
  alloc_->deallocate(p, nullptr);  // release_threshold:0 trims at every free
  const size_t free_before = sim_free();
  EXPECT_EQ(free_before, kDevice - 4 * GiB);
  alloc_->release_cached();
  EXPECT_EQ(sim_free(), free_before);
  const core::DeviceStats s = alloc_->stats();
  EXPECT_EQ(s.physical_bytes, 4 * GiB);
  EXPECT_EQ(s.reserved_unused_bytes, 4 * GiB);
  EXPECT_EQ(s.num_released_pages, 0u);
  // Memory beyond the reservation still goes back.
  p = alloc_->allocate(6 * GiB, nullptr);
  alloc_->deallocate(p, nullptr);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 4 * GiB);
  EXPECT_EQ(sim_free(), kDevice - 4 * GiB);
}

TEST_F(ReserveTest, UnreserveGivesItBack) {
  make(sim_config(kDevice), conf_opts("reserve:0.9", kDevice));
  void* p = alloc_->allocate(100 * MiB, nullptr);
  const size_t want = static_cast<size_t>(0.9 * static_cast<double>(kDevice)) / (2 * MiB) * 2 * MiB;
  EXPECT_EQ(sim_free(), kDevice - want);
  EXPECT_EQ(alloc_->reserve(0), 0u);
  // What the live block touches stays (as cached memory would), the rest went back.
  EXPECT_EQ(sim_free(), kDevice - alloc_->stats().touched_bytes);
  EXPECT_EQ(alloc_->stats().reserved_bytes, 0u);
  alloc_->deallocate(p, nullptr);
  alloc_->release_cached();
  EXPECT_EQ(sim_free(), kDevice);
}

TEST_F(ReserveTest, GrowsAndShrinksAtRunTime) {
  make(sim_config(kDevice));
  EXPECT_EQ(alloc_->reserve(2 * GiB), 2 * GiB);
  EXPECT_EQ(sim_free(), kDevice - 2 * GiB);
  EXPECT_EQ(alloc_->reserve(5 * GiB), 5 * GiB);
  EXPECT_EQ(sim_free(), kDevice - 5 * GiB);
  void* p = alloc_->allocate(3 * GiB, nullptr);
  EXPECT_EQ(alloc_->reserve(1 * GiB), 1 * GiB);  // the live block's pages stay
  EXPECT_EQ(alloc_->stats().physical_bytes, 3 * GiB);
  alloc_->deallocate(p, nullptr);
  alloc_->release_cached();
  EXPECT_EQ(alloc_->stats().physical_bytes, 1 * GiB);
  EXPECT_EQ(sim_free(), kDevice - 1 * GiB);
}

TEST_F(ReserveTest, MoreThanIsFreeFailsClearlyAndHoldsNothing) {
  make(sim_config(kDevice));
  core::DeviceAllocator& b = other();
  void* q = b.allocate(3 * GiB, nullptr);
  try {
    alloc_->reserve(6 * GiB);
    FAIL() << "a reservation larger than free memory succeeded";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("asked 6 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("5 GiB free"), std::string::npos) << m;
    EXPECT_NE(m.find("3 GiB of 8 GiB taken"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing is held"), std::string::npos) << m;
  }
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  EXPECT_EQ(alloc_->stats().reserved_bytes, 0u);
  EXPECT_EQ(sim_free(), 5 * GiB);
  b.deallocate(q, nullptr);
  other_.reset();
  // Through EXPANSE_CONF the first allocation fails the same way, and a later one tries again.
  make(sim_config(kDevice), conf_opts("reserve:0.9", kDevice));
  core::DeviceAllocator& c = other();
  q = c.allocate(3 * GiB, nullptr);
  EXPECT_THROW(alloc_->allocate(1 * MiB, nullptr), out_of_memory);
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  c.deallocate(q, nullptr);
  c.release_cached();
  void* p = alloc_->allocate(1 * MiB, nullptr);
  EXPECT_GE(alloc_->stats().reserved_bytes, 7 * GiB);
  alloc_->deallocate(p, nullptr);
}

TEST_F(ReserveTest, AboveTheLimitOrTheDeviceIsAUsageError) {
  make(sim_config(kDevice), conf_opts("limit:4GiB", kDevice));
  EXPECT_THROW(alloc_->reserve(5 * GiB), usage_error);
  EXPECT_THROW(alloc_->reserve(9 * GiB), usage_error);
  EXPECT_EQ(alloc_->reserve(4 * GiB), 4 * GiB);
  EXPECT_THROW(alloc_->set_limit(2 * GiB), usage_error);
  EXPECT_EQ(alloc_->limit(), 4 * GiB);
  alloc_->set_limit(6 * GiB);
  EXPECT_EQ(alloc_->limit(), 6 * GiB);
}

TEST_F(ReserveTest, PartialKeepsWhatTheDriverGaveAndSaysSo) {
  make(sim_config(kDevice), conf_opts("reserve_partial:true", kDevice));
  core::DeviceAllocator& b = other();
  void* q = b.allocate(3 * GiB, nullptr);
  EXPECT_EQ(alloc_->reserve(6 * GiB), 5 * GiB);
  const core::DeviceStats s = alloc_->stats();
  EXPECT_EQ(s.reserved_bytes, 5 * GiB);
  EXPECT_EQ(s.reserve_asked_bytes, 6 * GiB);
  EXPECT_EQ(sim_free(), 0u);
  b.deallocate(q, nullptr);
}

TEST_F(ReserveTest, FreeTakesAllThatIsFreeLessTheMargin) {
  make(sim_config(kDevice), conf_opts("reserve:free,reserve_margin:1GiB", kDevice));
  core::DeviceAllocator& b = other();
  void* q = b.allocate(2 * GiB, nullptr);
  void* p = alloc_->allocate(1 * MiB, nullptr);
  EXPECT_EQ(alloc_->stats().reserved_bytes, 5 * GiB);
  EXPECT_EQ(sim_free(), 1 * GiB);
  alloc_->deallocate(p, nullptr);
  b.deallocate(q, nullptr);
}

TEST_F(ReserveTest, AFailedDriverCallDuringReserveLeavesNothingHeld) {
  // 2 GiB is two handles by default; in one-page handles, a failure can come late.
  for (const auto& [conf, nth] : {std::pair<const char*, uint64_t>{"", 1},
                                  {"", 2},
                                  {"reserve_handle_size:2MiB", 17},
                                  {"reserve_handle_size:2MiB", 500}}) {
    SCOPED_TRACE(std::string(conf) + " " + std::to_string(nth));
    make(sim_config(kDevice), conf_opts(conf, kDevice));
    sim::inject_failure(EntryPoint::mem_create, nth, CUDA_ERROR_UNKNOWN);
    EXPECT_THROW(alloc_->reserve(2 * GiB), driver_failure);
    sim::clear_injections();
    EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
    EXPECT_EQ(alloc_->stats().reserved_bytes, 0u);
    EXPECT_EQ(sim::outstanding(0).allocations, 0u) << sim::describe_outstanding();
    EXPECT_EQ(alloc_->reserve(2 * GiB), 2 * GiB);  // and a later one works
  }
  // Out of memory injected part way: the same, as an out-of-memory error (one-page handles: a
  // larger one refused is tried again in halves).
  make(sim_config(kDevice), conf_opts("reserve_handle_size:2MiB", kDevice));
  sim::inject_failure(EntryPoint::mem_create, 300, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_THROW(alloc_->reserve(2 * GiB), out_of_memory);
  sim::clear_injections();
  EXPECT_EQ(sim::outstanding(0).allocations, 0u) << sim::describe_outstanding();
}

TEST_F(ReserveTest, ASleepingPoolKeepsReservedPagesAndWakesWithoutCreating) {
  make(sim_config(kDevice));
  alloc_->reserve(2 * GiB);
  alloc_->create_pool(1);
  void* p = alloc_->allocate(256 * MiB, nullptr, 1);
  fill_pattern(p, 256 * MiB, 3);
  const uint64_t creates = sim::call_count(EntryPoint::mem_create);
  ASSERT_TRUE(alloc_->sleep_pool(1, core::DeviceAllocator::SleepMode::offload));
  EXPECT_EQ(alloc_->stats().physical_bytes, 2 * GiB);  // kept by the reservation, pooled
  EXPECT_EQ(sim_free(), kDevice - 2 * GiB);
  alloc_->wake_pool(1);
  EXPECT_EQ(check_pattern(p, 256 * MiB, 3), SIZE_MAX);
  EXPECT_EQ(sim::call_count(EntryPoint::mem_create), creates);
  alloc_->deallocate(p, nullptr);
  alloc_->release_pool(1);
  alloc_->release_cached();  // pool 1's memory returns to the default pool; the reservation stays
  EXPECT_EQ(alloc_->stats().physical_bytes, 2 * GiB);
  // Unreserved, a sleep gives the pages to the driver.
  alloc_->reserve(0);
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  alloc_->create_pool(2);
  p = alloc_->allocate(256 * MiB, nullptr, 2);
  ASSERT_TRUE(alloc_->sleep_pool(2, core::DeviceAllocator::SleepMode::discard));
  EXPECT_EQ(alloc_->stats().physical_bytes, 0u);
  alloc_->wake_pool(2);
  alloc_->deallocate(p, nullptr);
  alloc_->release_pool(2);
}

// A large block after a mixed workload costs about the same driver time with a reservation as
// without one: the reserved pages it takes are in the shapes blocks had, not in one handle per
// page, each a mapping (59 + 41 + 3.3 us a page on an H100). Reshaped with the default margin
// as room (the new shapes are created before what they replace goes); with no margin and
// reserve_may_dip (released first), of the same memory as the run without a reservation.
TEST_F(ReserveTest, ALargeBlockCostsNoMoreDriverTimeWithAReservation) {
  for (uint64_t seed : {11, 12, 13}) {
    const Figures none = mixed_then_large("", seed, 64 * MiB);
    const Figures held = mixed_then_large("reserve:free", seed, 64 * MiB);
    const Figures dip = mixed_then_large("reserve:free,reserve_margin:0,reserve_may_dip:true", seed,
                                         64 * MiB);
    const Figures tight = mixed_then_large("reserve:free,reserve_margin:0", seed, 64 * MiB);
    std::printf("[ figures  ] seed %llu: the large block %.2f ms modeled (%llu cuMemMap) without a "
                "reservation, %.2f ms (%llu) with reserve:free, %.2f ms (%llu) with no margin "
                "and reserve_may_dip, %.2f ms (%llu) with no margin (one-page handles)\n",
                static_cast<unsigned long long>(seed), none.request_ns * 1e-6,
                static_cast<unsigned long long>(none.request_maps), held.request_ns * 1e-6,
                static_cast<unsigned long long>(held.request_maps), dip.request_ns * 1e-6,
                static_cast<unsigned long long>(dip.request_maps), tight.request_ns * 1e-6,
                static_cast<unsigned long long>(tight.request_maps));
    EXPECT_LE(held.request_ns, 1.25 * none.request_ns) << "seed " << seed;
    EXPECT_LE(dip.request_ns, 1.1 * none.request_ns) << "seed " << seed;
  }
}

// Reserved handles cut for smaller blocks: once each, into pieces the next blocks take, not
// released for every block and created again after it (the churn of large handles created back
// whole). The figures are printed for docs/design.md.
TEST_F(ReserveTest, AMixedWorkloadCutsReservedHandlesWithoutChurn) {
  const Figures none = mixed_then_large("", 11, 64 * MiB);
  const Figures held = mixed_then_large("reserve:0.9", 11, 64 * MiB);
  const Figures one_page = mixed_then_large("reserve:0.9,reserve_handle_size:2MiB", 11, 64 * MiB);
  for (const auto& [name, f] : {std::pair<const char*, const Figures&>{"no reservation", none},
                                {"reserve:0.9", held},
                                {"reserve:0.9, one-page handles", one_page}}) {
    std::printf("[ figures  ] %s: %llu cuMemCreate, %llu cuMemRelease, %llu cuMemMap after the "
                "first allocation; the large block %.2f ms modeled (%llu cuMemCreate, %llu "
                "cuMemMap)\n",
                name, static_cast<unsigned long long>(f.creates),
                static_cast<unsigned long long>(f.releases),
                static_cast<unsigned long long>(f.maps), f.request_ns * 1e-6,
                static_cast<unsigned long long>(f.request_creates),
                static_cast<unsigned long long>(f.request_maps));
  }
  EXPECT_LE(held.creates + held.releases, 2 * (none.creates + none.releases));
  EXPECT_LE(held.maps, none.maps * 11 / 10);
  // One-page handles create nothing while the reservation covers the workload (the large block
  // reaches beyond it) but map a handle per page.
  EXPECT_EQ(one_page.creates - one_page.request_creates, 0u);
  EXPECT_GT(one_page.maps, 2 * none.maps);
}

// Registrable blocks (one handle each, outside the page books) are held memory too: the
// reservation counts them, stays whole when they go, and makes room for them.
TEST_F(ReserveTest, ARegistrableBlockTakesItsShareOfTheReservationAndGivesItBack) {
  make(sim_config(kDevice), conf_opts("registrable:on", kDevice));
  void* p = alloc_->allocate(4 * GiB, nullptr);
  EXPECT_EQ(alloc_->reserve(2 * GiB), 2 * GiB);  // covered by the live block: nothing created
  EXPECT_EQ(alloc_->stats().reserved_unused_bytes, 0u) << "the live block uses all of it";
  alloc_->deallocate(p, nullptr);
  core::DeviceStats s = alloc_->stats();
  EXPECT_GE(s.physical_bytes, s.reserved_bytes) << "held whole after the block went";
  EXPECT_EQ(s.reserved_bytes, 2 * GiB);
  void* q = alloc_->allocate(1 * GiB, nullptr);
  s = alloc_->stats();
  EXPECT_GE(s.physical_bytes, s.reserved_bytes);
  EXPECT_EQ(s.reserved_unused_bytes, 1 * GiB);
  alloc_->deallocate(q, nullptr);
  EXPECT_EQ(books_vs_driver(), "");
}

TEST_F(ReserveTest, AllFreeReservedStillServesRegistrableBlocks) {
  make(sim_config(kDevice), conf_opts("reserve:free,reserve_margin:0,registrable:on", kDevice));
  void* p = alloc_->allocate(2 * MiB, nullptr);  // the reservation holds the whole device
  ASSERT_NE(p, nullptr);
  const core::DeviceStats s = alloc_->stats();
  EXPECT_EQ(s.reserved_bytes, kDevice);
  EXPECT_EQ(s.physical_bytes, kDevice) << "the block took a share of the reservation, no more";
  EXPECT_EQ(sim_free(), 0u);
  alloc_->deallocate(p, nullptr);
  EXPECT_EQ(alloc_->stats().physical_bytes, kDevice);
  EXPECT_EQ(books_vs_driver(), "");
}

TEST_F(ReserveTest, ARegistrableBlockNeverTakesMemoryPastTheLimit) {
  // A reservation as large as the limit leaves no room to create a handle before the reserved
  // pages it replaces go: a registrable block (one handle of its own) that no pooled handle fits
  // is refused, naming the way out, and nothing is given back meanwhile.
  make(sim_config(kDevice), conf_opts("limit:4GiB,reserve:4GiB,registrable:on", kDevice));
  try {
    alloc_->allocate(1 * GiB, nullptr);
    ADD_FAILURE() << "a 1 GiB registrable block with no room beside the reservation";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("reserve_may_dip"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc_->stats().physical_bytes, 4 * GiB);
  EXPECT_EQ(alloc_->stats().physical_low_water_bytes, 4 * GiB) << "the reservation never dipped";
  // One page: the reservation's pooled one-page handles fit it as they are.
  void* small = alloc_->allocate(2 * MiB, nullptr);
  EXPECT_EQ(alloc_->stats().physical_bytes, 4 * GiB);
  alloc_->deallocate(small, nullptr);
  EXPECT_EQ(alloc_->stats().physical_low_water_bytes, 4 * GiB);
  EXPECT_EQ(books_vs_driver(), "");

  // reserve_may_dip lets the reservation's pooled pages go first: never past the limit either.
  make(sim_config(kDevice),
       conf_opts("limit:4GiB,reserve:4GiB,registrable:on,reserve_may_dip:true", kDevice));
  void* p = alloc_->allocate(1 * GiB, nullptr);
  EXPECT_LE(alloc_->stats().physical_bytes, 4 * GiB);
  EXPECT_THROW(alloc_->allocate(3 * GiB + 2 * MiB, nullptr), out_of_memory);
  EXPECT_LE(alloc_->stats().physical_bytes, 4 * GiB);
  alloc_->deallocate(p, nullptr);
  EXPECT_EQ(alloc_->stats().physical_bytes, 4 * GiB);
  EXPECT_EQ(books_vs_driver(), "");
}

// A greedy neighbour: another process on the device that takes every free byte after each
// cuMemRelease (the sim's neighbour hook), as a process sharing a GPU would grab memory in a gap.
// Under reserve:0.9 on 8 GiB, a random workload the reservation covers, with blocks filled with
// patterns and checked before they go: the physical memory held never falls below the
// reservation (physical_low_water_bytes, counted at the driver calls, inside calls too), no
// covered allocation fails, and no block's bytes change. Without a neighbour the same, with the
// margin as the room reshaping creates in. With reserve_may_dip (released first) the neighbour
// takes reserved memory: the low-water mark shows it, so the check can fail.
struct NeighbourRun {
  size_t reserved = 0;
  size_t low_water = 0;
  size_t covered_failures = 0;
  size_t covered = 0;
  size_t stranded_peak = 0;
  size_t neighbour = 0;
  size_t allocations = 0;
  size_t refused_creates = 0;  // cuMemCreate calls the driver refused (the neighbour held it)
  std::string first_failure;
};

class ReserveNeighbourTest : public ReserveTest {
 protected:
  NeighbourRun run(const std::string& conf, bool greedy, uint64_t seed, int steps) {
    make(sim_config(kDevice), conf_opts(conf, kDevice));
    NeighbourRun out;
    if (greedy) {
      sim::set_neighbour([&out](EntryPoint e, CUresult r, sim::Neighbour& n) {
        if (e == EntryPoint::mem_release && r == CUDA_SUCCESS) n.take(0, SIZE_MAX);
        if (e == EntryPoint::mem_create && r != CUDA_SUCCESS) ++out.refused_creates;
      });
    }
    std::mt19937_64 rng(seed);
    struct Live {
      void* p;
      size_t n;
      uint8_t seed;
    };
    std::vector<Live> live;
    auto size_of = [&]() -> size_t {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 4) return 512 + rng() % (1 * MiB);
      if (kind < 8) return 2 * MiB + rng() % (48 * MiB);
      return 64 * MiB + rng() % (700 * MiB);
    };
    try {
      alloc_->deallocate(alloc_->allocate(512, nullptr), nullptr);  // the reservation is made
    } catch (const out_of_memory& e) {
      ++out.covered_failures;
      out.first_failure = e.what();
    }
    out.reserved = alloc_->stats().reserved_bytes;
    const size_t page = alloc_->page_size();
    for (int i = 0; i < steps; ++i) {
      if (live.empty() || rng() % 100 < 55) {
        const size_t n = size_of();
        const core::DeviceStats s = alloc_->stats();
        // Covered: the pages it may touch are the reservation's, unused (edge pages included).
        const bool covered = (n + page - 1) / page + 2 <= s.reserved_unused_bytes / page;
        void* p = nullptr;
        try {
          p = alloc_->allocate(n, nullptr);
        } catch (const out_of_memory& e) {
          if (covered) {
            ++out.covered_failures;
            if (out.first_failure.empty()) out.first_failure = e.what();
          }
        }
        out.covered += covered ? 1 : 0;
        ++out.allocations;
        if (p != nullptr) {
          const auto tag = static_cast<uint8_t>(i);
          fill_pattern(p, std::min(n, size_t{1} << 20), tag);
          live.push_back({p, n, tag});
        }
      } else {
        const size_t k = rng() % live.size();
        EXPECT_EQ(check_pattern(live[k].p, std::min(live[k].n, size_t{1} << 20), live[k].seed),
                  SIZE_MAX)
            << "step " << i;
        alloc_->deallocate(live[k].p, nullptr);
        live[k] = live.back();
        live.pop_back();
      }
      const core::DeviceStats s = alloc_->stats();
      out.stranded_peak = std::max<size_t>(out.stranded_peak, s.reserve_stranded_bytes);
      if (i % 200 == 0) {
        EXPECT_EQ(books_vs_driver(), "") << "step " << i;
      }
    }
    for (const Live& l : live) {
      EXPECT_EQ(check_pattern(l.p, std::min(l.n, size_t{1} << 20), l.seed), SIZE_MAX);
      alloc_->deallocate(l.p, nullptr);
    }
    out.low_water = alloc_->stats().physical_low_water_bytes;
    EXPECT_EQ(alloc_->stats().reserve_stranded_bytes, 0u) << "no block is live: none stranded";
    out.neighbour = sim::neighbour_holds(0);
    EXPECT_EQ(books_vs_driver(), "");
    sim::set_neighbour(nullptr);
    return out;
  }
};

TEST_F(ReserveNeighbourTest, AGreedyNeighbourNeverTakesReservedMemory) {
  for (uint64_t seed : {1, 2, 3}) {
    for (bool greedy : {false, true}) {
      const NeighbourRun r = run("reserve:0.9", greedy, seed, 1500);
      std::printf("[ figures  ] seed %llu, %s: reserved %.2f GiB, low water %.2f GiB, %zu covered "
                  "allocations, %zu failed, stranded at most %.0f MiB, the neighbour holds "
                  "%.2f GiB\n",
                  static_cast<unsigned long long>(seed), greedy ? "greedy neighbour" : "alone",
                  static_cast<double>(r.reserved) / GiB, static_cast<double>(r.low_water) / GiB,
                  r.covered, r.covered_failures, static_cast<double>(r.stranded_peak) / MiB,
                  static_cast<double>(r.neighbour) / GiB);
      EXPECT_GE(r.low_water, r.reserved) << "seed " << seed << (greedy ? " greedy" : "");
      EXPECT_EQ(r.covered_failures, 0u) << "seed " << seed << ": " << r.first_failure;
      EXPECT_GT(r.covered, 100u);
      if (greedy) {
        EXPECT_GT(r.neighbour, 0u) << "the neighbour took something";
        // Once the driver refuses, it is asked again ever more rarely (PageSupply::create_refused):
        // not at every allocation the pooled pages serve.
        std::printf("[ figures  ]   %zu cuMemCreate refused in %zu allocations\n",
                    r.refused_creates, r.allocations);
        EXPECT_LE(r.refused_creates, r.allocations / 10) << "seed " << seed;
      }
    }
  }
}

// One-page reserved handles are never reshaped: under the neighbour they strand nothing.
TEST_F(ReserveNeighbourTest, OnePageReservedHandlesStrandNothing) {
  const NeighbourRun r = run("reserve:0.9,reserve_handle_size:2MiB", true, 1, 1500);
  std::printf("[ figures  ] one-page handles, greedy neighbour: low water %.2f GiB of %.2f GiB, "
              "%zu covered allocations, %zu failed, stranded at most %.0f MiB\n",
              static_cast<double>(r.low_water) / GiB, static_cast<double>(r.reserved) / GiB,
              r.covered, r.covered_failures, static_cast<double>(r.stranded_peak) / MiB);
  EXPECT_GE(r.low_water, r.reserved);
  EXPECT_EQ(r.covered_failures, 0u) << r.first_failure;
  EXPECT_EQ(r.stranded_peak, 0u);
}

TEST_F(ReserveNeighbourTest, ReleasingFirstLetsTheNeighbourTakeReservedMemory) {
  const NeighbourRun r = run("reserve:0.9,reserve_may_dip:true", true, 1, 1500);
  EXPECT_LT(r.low_water, r.reserved) << "released first, the reservation dips";
  EXPECT_GT(r.covered_failures, 0u) << "and what it covered fails";
}

}  // namespace
}  // namespace expanse::test
