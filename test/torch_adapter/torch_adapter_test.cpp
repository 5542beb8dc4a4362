// The torch-free half of the native PyTorch allocator against expanse on the sim: what
// torch.cuda.memory_stats(), cudnn.benchmark's cacheInfo and torch.cuda.OutOfMemoryError's
// message are made of, and the C API calls it reads them through; and the map from PyTorch's
// memory pool ids to expanse pools (PoolMap, FilterTable) that CUDA graphs and MemPool use.
#include "torch_adapter.hpp"

#include "expanse/expanse.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace ta = expanse::torch_adapter;

namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;

class TorchAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(expanse_init("driver:sim,sim_capacity:1GiB"), EXPANSE_OK) << expanse_last_error();
  }
  void TearDown() override {
    for (void* p : live_) expanse_free(p, 0, 0, nullptr);
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  }
  void* alloc(uint64_t n) {
    void* p = nullptr;
    EXPECT_EQ(expanse_malloc_checked(&p, n, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    if (p != nullptr) live_.push_back(p);
    return p;
  }
  void release(void* p) {
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (*it == p) {
        live_.erase(it);
        break;
      }
    }
    ASSERT_EQ(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  }
  static expanse_stats stats() {
    expanse_stats s;
    EXPECT_EQ(ta::read_stats(0, s), EXPANSE_OK) << expanse_last_error();
    return s;
  }
  static ta::Segments segments() {
    ta::Segments s;
    EXPECT_EQ(ta::read_segments(0, s), EXPANSE_OK) << expanse_last_error();
    return s;
  }
  static int64_t i(uint64_t v) { return static_cast<int64_t>(v); }

  std::vector<void*> live_;
};

// ---- the C API the adapter reads --------------------------------------------------------------

TEST_F(TorchAdapterTest, SegmentsCountFirstThenCopyWithinCapacity) {
  alloc(4 * KiB);
  alloc(8 * MiB);
  size_t ns = 0, nb = 0;
  ASSERT_EQ(expanse_get_segments(0, nullptr, &ns, nullptr, &nb), EXPANSE_OK) << expanse_last_error();
  ASSERT_GE(ns, 2u);  // one in each arena
  ASSERT_GE(nb, 2u);
  // Room for one segment and one block: the totals come back, nothing past the room is written.
  std::vector<expanse_segment_info> segs(2);
  std::vector<expanse_block_info> blocks(2);
  segs[1].address = 0xDEAD;
  blocks[1].address = 0xBEEF;
  size_t ns1 = 1, nb1 = 1;
  ASSERT_EQ(expanse_get_segments(0, segs.data(), &ns1, blocks.data(), &nb1), EXPANSE_OK);
  EXPECT_EQ(ns1, ns);
  EXPECT_EQ(nb1, nb);
  EXPECT_EQ(segs[1].address, 0xDEADu);
  EXPECT_EQ(blocks[1].address, 0xBEEFu);
  EXPECT_NE(segs[0].address, 0u);
}

TEST_F(TorchAdapterTest, SegmentsRefuseNullWithRoomAndNameIt) {
  size_t ns = 4, nb = 0;
  EXPECT_EQ(expanse_get_segments(0, nullptr, &ns, nullptr, &nb), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("capacity of 0"), std::string::npos);
  EXPECT_EQ(expanse_get_segments(0, nullptr, nullptr, nullptr, &nb), EXPANSE_EINVAL);
  ns = 0;
  EXPECT_EQ(expanse_get_segments(7, nullptr, &ns, nullptr, &nb), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("device 7"), std::string::npos);
}

TEST_F(TorchAdapterTest, SegmentsOfAnUnusedDeviceAreNone) {
  ta::Segments s;
  ASSERT_EQ(ta::read_segments(0, s), EXPANSE_OK) << expanse_last_error();
  EXPECT_TRUE(s.segments.empty());
  EXPECT_TRUE(s.blocks.empty());
}

TEST_F(TorchAdapterTest, BlocksTellLiveFromFreeWithRequestedSizes) {
  void* a = alloc(3 * MiB + 100);
  void* b = alloc(5 * MiB);
  release(b);
  const ta::Segments s = segments();
  bool saw_a = false;
  for (const expanse_block_info& blk : s.blocks) {
    if (blk.address == reinterpret_cast<uint64_t>(a)) {
      saw_a = true;
      EXPECT_EQ(blk.state, static_cast<uint32_t>(EXPANSE_BLOCK_LIVE));
      EXPECT_EQ(blk.requested, 3 * MiB + 100);
      EXPECT_EQ(blk.size % 512, 0u);
      EXPECT_GE(blk.size, blk.requested);
    } else {
      EXPECT_NE(blk.state, static_cast<uint32_t>(EXPANSE_BLOCK_LIVE));
      EXPECT_EQ(blk.requested, 0u);
    }
  }
  EXPECT_TRUE(saw_a);
  // Every block lies inside its segment, and the segments' block ranges cover the list.
  uint64_t covered = 0;
  for (const expanse_segment_info& seg : s.segments) {
    EXPECT_EQ(seg.first_block, covered);
    covered += seg.num_blocks;
    for (uint64_t k = seg.first_block; k < seg.first_block + seg.num_blocks; ++k) {
      EXPECT_GE(s.blocks[k].address, seg.address);
      EXPECT_LE(s.blocks[k].address + s.blocks[k].size, seg.address + seg.size);
    }
  }
  EXPECT_EQ(covered, s.blocks.size());
}

TEST_F(TorchAdapterTest, TraceHandsOutTheRecordedHistory) {
  ASSERT_EQ(expanse_record_history(1, 1000), EXPANSE_OK) << expanse_last_error();
  void* p = alloc(1 * MiB);
  release(p);
  std::vector<expanse_trace_entry> t;
  ASSERT_EQ(ta::read_trace(0, t), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_record_history(0, 0), EXPANSE_OK);
  std::vector<uint32_t> actions;
  for (const auto& e : t) {
    const bool block_event = e.action != EXPANSE_TRACE_SEGMENT_MAP && e.action != EXPANSE_TRACE_SEGMENT_UNMAP;
    if (block_event && e.addr == reinterpret_cast<uint64_t>(p)) actions.push_back(e.action);
  }
  const std::vector<uint32_t> want = {EXPANSE_TRACE_ALLOC, EXPANSE_TRACE_FREE_REQUESTED,
                                      EXPANSE_TRACE_FREE_COMPLETED};
  EXPECT_EQ(actions, want);
  bool mapped = false;
  for (const auto& e : t) mapped = mapped || e.action == EXPANSE_TRACE_SEGMENT_MAP;
  EXPECT_TRUE(mapped);
  EXPECT_GT(t.front().time_us, 0);
}

TEST_F(TorchAdapterTest, MallocCheckedTellsOutOfMemoryFromBadInput) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(expanse_malloc_checked(&p, 4 * GiB, 0, nullptr), EXPANSE_ENOMEM);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(expanse_malloc_checked(&p, 1 * MiB, 9, nullptr), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_malloc_checked(nullptr, 1 * MiB, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("out must not be NULL"), std::string::npos);
  EXPECT_EQ(expanse_malloc_checked(&p, 0, 0, nullptr), EXPANSE_OK);
  EXPECT_EQ(p, nullptr);
}

// ---- memory_stats ----------------------------------------------------------------------------

TEST_F(TorchAdapterTest, StatsAggregateIsExpansesOwnBooks) {
  alloc(4 * KiB);
  alloc(100 * KiB);
  void* big = alloc(8 * MiB + 1);
  alloc(30 * MiB);
  release(big);
  const expanse_stats s = stats();
  ta::Baseline b;
  const ta::DeviceStats d = ta::map_device_stats(s, segments(), b);
  const size_t A = ta::kAggregate;
  EXPECT_EQ(d.allocation[A].current, i(s.live_blocks));
  EXPECT_EQ(d.allocated_bytes[A].current, i(s.allocated_bytes));
  EXPECT_EQ(d.requested_bytes[A].current, i(s.requested_bytes));
  EXPECT_EQ(d.reserved_bytes[A].current, i(s.physical_bytes));
  EXPECT_EQ(d.allocated_bytes[A].peak, i(s.peak_allocated_bytes));
  EXPECT_EQ(d.requested_bytes[A].peak, i(s.peak_requested_bytes));
  EXPECT_EQ(d.reserved_bytes[A].peak, i(s.peak_physical_bytes));
  EXPECT_EQ(d.allocation[A].allocated, 4);
  EXPECT_EQ(d.allocation[A].freed, 1);
  EXPECT_EQ(d.num_ooms, 0);
  EXPECT_EQ(d.max_split_size, -1);
  // No free block is awaiting other streams here: active is what is allocated.
  EXPECT_EQ(d.active_bytes[A].current, d.allocated_bytes[A].current);
  EXPECT_EQ(d.active[A].current, d.allocation[A].current);
}

TEST_F(TorchAdapterTest, StatsSplitSmallAndLargePoolsLikePyTorch) {
  alloc(4 * KiB);    // small arena (<= 1 MiB)
  alloc(512 * KiB);  // small
  alloc(3 * MiB);    // large
  ta::Baseline b;
  const ta::DeviceStats d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocation[ta::kSmallPool].current, 2);
  EXPECT_EQ(d.allocation[ta::kLargePool].current, 1);
  EXPECT_EQ(d.requested_bytes[ta::kSmallPool].current, i(516 * KiB));
  EXPECT_EQ(d.requested_bytes[ta::kLargePool].current, i(3 * MiB));
  // The pools add up to the aggregate, figure by figure.
  const ta::StatArray* arrays[] = {&d.allocation,      &d.segment,         &d.active,
                                   &d.inactive_split,  &d.allocated_bytes, &d.reserved_bytes,
                                   &d.active_bytes,    &d.inactive_split_bytes,
                                   &d.requested_bytes};
  for (const ta::StatArray* a : arrays) {
    EXPECT_EQ((*a)[ta::kAggregate].current,
              (*a)[ta::kSmallPool].current + (*a)[ta::kLargePool].current);
  }
  // Reserved covers what is allocated and what lies free inside the segments.
  for (size_t k : {ta::kSmallPool, ta::kLargePool}) {
    EXPECT_GE(d.reserved_bytes[k].current,
              d.allocated_bytes[k].current + d.inactive_split_bytes[k].current);
    EXPECT_GE(d.segment[k].current, 1);
  }
}

TEST_F(TorchAdapterTest, ResetAccumulatedCountsFromThere) {
  void* p = alloc(1 * MiB);
  release(p);
  ta::Baseline b;
  ta::reset_accumulated(stats(), b);
  ta::DeviceStats d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocation[ta::kAggregate].allocated, 0);
  EXPECT_EQ(d.allocation[ta::kAggregate].freed, 0);
  alloc(2 * MiB);
  d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocation[ta::kAggregate].allocated, 1);
  EXPECT_EQ(d.allocation[ta::kAggregate].freed, 0);
}

TEST_F(TorchAdapterTest, PeaksFollowExpanseAndTheirReset) {
  void* a = alloc(16 * MiB);
  void* b2 = alloc(16 * MiB);
  release(a);
  release(b2);
  ta::Baseline b;
  ta::DeviceStats d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_GE(d.allocated_bytes[ta::kAggregate].peak, i(32 * MiB));
  EXPECT_EQ(d.allocated_bytes[ta::kAggregate].current, 0);
  // A count's peak is the most seen by a read: the read above saw none live.
  EXPECT_EQ(d.allocation[ta::kAggregate].peak, 0);
  void* c = alloc(1 * MiB);
  d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocation[ta::kAggregate].peak, 1);
  release(c);
  d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocation[ta::kAggregate].peak, 1);  // kept after the free
  ASSERT_EQ(expanse_reset_peak_stats(0), EXPANSE_OK);
  ta::reset_seen_peaks(b);
  d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.allocated_bytes[ta::kAggregate].peak, 0);
  EXPECT_EQ(d.allocation[ta::kAggregate].peak, 0);
  for (size_t k = 0; k < ta::kNumPools; ++k) {
    EXPECT_GE(d.reserved_bytes[k].peak, d.reserved_bytes[k].current);
  }
}

// torch.cuda.empty_cache() releases every device's cache: a device expanse never set up has
// none, and setting it up (a CUDA context on a GPU this process may never use) is not asked for.
// The witness: a configuration that no device can be set up with.
TEST(TorchAdapterEmptyCache, ReleasingAnUnusedDeviceDoesNotSetItUp) {
  ASSERT_EQ(expanse_init("driver:sim,sim_devices:2,sim_granularity:2MiB,page_size:1MiB"),
            EXPANSE_OK)
      << expanse_last_error();
  void* p = nullptr;
  ASSERT_NE(expanse_malloc_checked(&p, 4096, 1, nullptr), EXPANSE_OK);  // device setup fails
  EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_release_cached(2), EXPANSE_EINVAL);  // no such device
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
}

TEST_F(TorchAdapterTest, OomsAreCountedAfterTheBaseline) {
  void* p = nullptr;
  ta::Baseline b;
  ta::reset_accumulated(stats(), b);
  EXPECT_EQ(expanse_malloc_checked(&p, 2 * GiB, 0, nullptr), EXPANSE_ENOMEM);
  const ta::DeviceStats d = ta::map_device_stats(stats(), segments(), b);
  EXPECT_EQ(d.num_ooms, 1);
}

// ---- cacheInfo ------------------------------------------------------------------------------

TEST_F(TorchAdapterTest, LargestBlockCanBeAllocatedAndOnePageMoreCannot) {
  ASSERT_EQ(expanse_set_limit(0, 64 * MiB), EXPANSE_OK) << expanse_last_error();
  alloc(10 * MiB);
  void* freed = alloc(6 * MiB);
  release(freed);  // cached: counts as obtainable
  const expanse_stats s = stats();
  const uint64_t largest = ta::largest_block(s, UINT64_MAX);
  ASSERT_GT(largest, 0u);
  EXPECT_EQ(largest % s.page_size, 0u);
  EXPECT_LE(largest, 64 * MiB - s.touched_bytes);
  void* p = nullptr;
  EXPECT_EQ(expanse_malloc_checked(&p, largest + s.page_size, 0, nullptr), EXPANSE_ENOMEM);
  EXPECT_EQ(expanse_malloc_checked(&p, largest, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  if (p != nullptr) live_.push_back(p);
}

TEST_F(TorchAdapterTest, LargestBlockUsesTheDriversFreeMemoryWhenKnown) {
  alloc(10 * MiB);
  const expanse_stats s = stats();
  const uint64_t unused = s.cached_bytes + s.pooled_bytes;
  EXPECT_EQ(ta::largest_block(s, 100 * MiB), (100 * MiB + unused) / s.page_size * s.page_size);
  // Unknown: the device's capacity less what expanse holds.
  EXPECT_EQ(ta::largest_block(s, UINT64_MAX),
            (s.capacity_bytes - s.physical_bytes + unused) / s.page_size * s.page_size);
}

// ---- set_per_process_memory_fraction --------------------------------------------------------

TEST_F(TorchAdapterTest, FractionBecomesALimitInWholePages) {
  // Sets device 0 up: a device never set up answers page_size 0 (docs/api.md, Statistics).
  ASSERT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK) << expanse_last_error();
  expanse_stats s = stats();
  const uint64_t limit = ta::limit_for_fraction(s, 0.25);
  EXPECT_EQ(limit, s.capacity_bytes / 4 / s.page_size * s.page_size);
  EXPECT_EQ(ta::limit_for_fraction(s, 1.0), static_cast<uint64_t>(SIZE_MAX));
  ASSERT_EQ(expanse_set_limit(0, static_cast<size_t>(limit)), EXPANSE_OK);
  s = stats();
  EXPECT_DOUBLE_EQ(ta::fraction_of_limit(s), 0.25);
  ASSERT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK);
  EXPECT_DOUBLE_EQ(ta::fraction_of_limit(stats()), 1.0);
}

// get_per_process_memory_fraction() answers the fraction set, as PyTorch's allocator does, though
// the limit it became was rounded down to whole pages; a limit set since by other means is read
// back as a fraction of the capacity.
TEST_F(TorchAdapterTest, FractionReadsBackAsSetThoughTheLimitIsWholePages) {
  // Sets device 0 up: a device never set up answers page_size 0 (docs/api.md, Statistics).
  ASSERT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK) << expanse_last_error();
  ta::Baseline b;
  expanse_stats s = stats();
  const uint64_t limit = ta::limit_for_fraction(s, 0.3);
  ASSERT_NE(static_cast<double>(limit) / static_cast<double>(s.capacity_bytes), 0.3);
  ASSERT_EQ(expanse_set_limit(0, static_cast<size_t>(limit)), EXPANSE_OK);
  ta::remember_fraction(b, 0.3, limit);
  EXPECT_EQ(ta::memory_fraction(stats(), b), 0.3);
  ASSERT_EQ(expanse_set_limit(0, 256 * MiB), EXPANSE_OK);  // expanse.set_limit, say
  EXPECT_DOUBLE_EQ(ta::memory_fraction(stats(), b), 0.25);
  ASSERT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK);
  EXPECT_EQ(ta::memory_fraction(stats(), b), 1.0);
}

// ---- torch.cuda.OutOfMemoryError's message --------------------------------------------------

TEST_F(TorchAdapterTest, SizesArePrintedAsPyTorchPrintsThem) {
  EXPECT_EQ(ta::format_size(512), "512 bytes");
  EXPECT_EQ(ta::format_size(1024), "1024 bytes");
  EXPECT_EQ(ta::format_size(1536), "1.50 KiB");
  EXPECT_EQ(ta::format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(ta::format_size(3 * GiB / 2), "1.50 GiB");
}

// Both OOM messages come from the library (expanse_format_oom); the native folder, which may
// include only the public headers, keeps a size formatter of its own for its other messages.
// This keeps the two writing PyTorch's format alike, at each unit's boundaries.
TEST_F(TorchAdapterTest, PluggablePairsOomWritesSizesAsTheNativeAllocatorDoes) {
  ASSERT_EQ(expanse_set_limit(0, 0), EXPANSE_OK) << expanse_last_error();
  for (uint64_t n : {uint64_t{512}, KiB, KiB + 1, 1536 * KiB / 1024, MiB, MiB + 1, 20 * MiB,
                     GiB, GiB + 1, 3 * GiB / 2}) {
    std::string m;
    try {
      void* p = expanse_torch_malloc(static_cast<size_t>(n), 0, nullptr);
      if (p != nullptr) live_.push_back(p);
    } catch (const std::exception& e) {
      m = e.what();
    }
    const std::string want = "CUDA out of memory. Tried to allocate " + ta::format_size(n) + ".";
    EXPECT_EQ(m.rfind(want, 0), 0u) << n << ": " << m;
  }
}

// One formatting serves both: the pluggable pair's exception says what the native allocator's
// OutOfMemoryError says for the same failure.
TEST_F(TorchAdapterTest, PluggablePairAndNativeAllocatorWordTheOomAlike) {
  std::string what;
  try {
    void* p = expanse_torch_malloc(2 * GiB, 0, nullptr);
    if (p != nullptr) live_.push_back(p);
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string why = expanse_last_error();
  ASSERT_FALSE(why.empty());
  EXPECT_EQ(what, ta::oom_message(2 * GiB, 0, stats(), why));
}

// expanse_format_oom's buffer: sized like expanse_get_segments' arrays (capacity in, total out),
// written only whole; a caller's shorter expanse_stats is read no further than its struct_size.
TEST_F(TorchAdapterTest, FormatOomTakesItsCapacityAndWritesOnlyAWholeMessage) {
  size_t need = 0;
  ASSERT_EQ(expanse_format_oom(2 * MiB, 0, nullptr, "the sim said no", nullptr, &need), EXPANSE_OK);
  ASSERT_GT(need, 1u);
  std::string small(10, 'x');
  size_t cap = small.size();
  ASSERT_EQ(expanse_format_oom(2 * MiB, 0, nullptr, "the sim said no", small.data(), &cap),
            EXPANSE_OK);
  EXPECT_EQ(cap, need);
  EXPECT_EQ(small, std::string(10, 'x')) << "a message that does not fit is not written";
  std::string full(need, 'x');
  cap = need;
  ASSERT_EQ(expanse_format_oom(2 * MiB, 0, nullptr, "the sim said no", full.data(), &cap), EXPANSE_OK);
  EXPECT_EQ(full[need - 1], '\0');
  full.resize(need - 1);
  EXPECT_EQ(full, ta::oom_message(2 * MiB, 0, stats(), "the sim said no"));
  EXPECT_EQ(full.rfind("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has", 0), 0u) << full;

  expanse_stats old = stats();
  old.struct_size = sizeof old.struct_size;  // figures past it unknown: none in the message
  char buf[256];
  cap = sizeof buf;
  ASSERT_EQ(expanse_format_oom(2 * MiB, 0, &old, nullptr, buf, &cap), EXPANSE_OK);
  EXPECT_EQ(std::string(buf), "CUDA out of memory. Tried to allocate 2.00 MiB.");

  EXPECT_EQ(expanse_format_oom(2 * MiB, 0, nullptr, nullptr, nullptr, nullptr), EXPANSE_EINVAL);
  cap = 5;
  EXPECT_EQ(expanse_format_oom(2 * MiB, 0, nullptr, nullptr, nullptr, &cap), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("buf is NULL"), std::string::npos);
}

TEST_F(TorchAdapterTest, OomMessageStartsLikePyTorchsAndEndsWithExpansesReason) {
  void* p = nullptr;
  ASSERT_EQ(expanse_malloc_checked(&p, 2 * GiB, 0, nullptr), EXPANSE_ENOMEM);
  const std::string why = expanse_last_error();
  ASSERT_FALSE(why.empty());
  const std::string m = ta::oom_message(2 * GiB, 0, stats(), why);
  const std::string start = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                            "capacity of 1024.00 MiB of which ";
  EXPECT_EQ(m.compare(0, start.size(), start), 0) << m;
  EXPECT_NE(m.find("allocated by PyTorch through expanse"), std::string::npos) << m;
  const std::string tail = " " + why;  // expanse's messages name expanse themselves
  EXPECT_EQ(why.rfind("expanse", 0), 0u) << why;
  ASSERT_GE(m.size(), tail.size());
  EXPECT_EQ(m.compare(m.size() - tail.size(), tail.size(), tail), 0) << m;
}

TEST_F(TorchAdapterTest, OomMessageNamesExpanseBeforeAReasonThatDoesNot) {
  const std::string m = ta::oom_message(1 * MiB, 0, stats(), "the sim said no");
  const std::string tail = " expanse: the sim said no";
  EXPECT_EQ(m.compare(m.size() - tail.size(), tail.size(), tail), 0) << m;
}

// What an OutOfMemoryObserver (torch._C._cuda_attach_out_of_memory_observer) is given, as
// PyTorch's own allocator gives it: the size of the failed request, the device's total (the
// fraction's cap where one is set) and what is still free.
TEST_F(TorchAdapterTest, OomObserverSeesTheRequestTheCapAndWhatIsFree) {
  alloc(8 * MiB);
  ASSERT_EQ(expanse_set_limit(0, 32 * MiB), EXPANSE_OK);
  void* p = nullptr;
  ASSERT_EQ(expanse_malloc_checked(&p, 64 * MiB, 0, nullptr), EXPANSE_ENOMEM);
  const expanse_stats s = stats();
  const ta::OomObserverArgs o = ta::oom_observer_args(64 * MiB, s);
  EXPECT_EQ(o.alloc_size, 64 * MiB);
  EXPECT_EQ(o.device_total, 32 * MiB);
  EXPECT_EQ(o.device_free, 32 * MiB - s.touched_bytes);
  ASSERT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK);
  const ta::OomObserverArgs u = ta::oom_observer_args(2 * GiB, stats());
  EXPECT_EQ(u.alloc_size, 2 * GiB);
  EXPECT_EQ(u.device_total, 1 * GiB);
  EXPECT_EQ(u.device_free, 1 * GiB - s.touched_bytes);
}

TEST_F(TorchAdapterTest, OomMessageNamesTheLimit) {
  ASSERT_EQ(expanse_set_limit(0, 32 * MiB), EXPANSE_OK);
  void* p = nullptr;
  ASSERT_EQ(expanse_malloc_checked(&p, 64 * MiB, 0, nullptr), EXPANSE_ENOMEM);
  const std::string m = ta::oom_message(64 * MiB, 0, stats(), expanse_last_error());
  EXPECT_NE(m.find("under its limit of 32.00 MiB"), std::string::npos) << m;
}

// ---- memory pools: PyTorch's pool ids on expanse pools ---------------------------------------

expanse_pool_stats pool_stats(expanse_pool_id id) {
  expanse_pool_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(expanse_pool_get_stats(id, &s), EXPANSE_OK) << expanse_last_error();
  return s;
}

expanse_pool_id pool_of(const void* p) {
  expanse_pool_id id = 99;
  EXPECT_EQ(expanse_pool_of(p, &id), EXPANSE_OK) << expanse_last_error();
  return id;
}

template <class F>
std::string pool_error(F&& f) {
  try {
    f();
  } catch (const ta::PoolError& e) {
    return e.what();
  }
  return "";
}

const ta::MempoolKey kGraph{0, 1, 0};   // a graph's pool: {uuid, 0}
const ta::MempoolKey kMemPool{0, 0, 1}; // a MemPool's: {0, uid}

TEST_F(TorchAdapterTest, PoolBeginCreatesWithUseCountOneThenRetains) {
  ta::PoolMap m;
  EXPECT_EQ(m.use_count(kGraph), 0) << "never created";
  m.begin(kGraph, [](CUstream_st*) { return true; });
  const expanse_pool_id id = m.id_of(kGraph);
  ASSERT_NE(id, 0u);
  EXPECT_EQ(m.use_count(kGraph), 1);
  void* in = alloc(MiB);
  EXPECT_EQ(pool_of(in), id) << "routed by the filter";
  m.end(kGraph);
  EXPECT_EQ(m.use_count(kGraph), 1) << "end keeps the use";
  void* out = alloc(MiB);
  EXPECT_EQ(pool_of(out), 0u) << "ended: the default pool";
  m.begin(kGraph, [](CUstream_st*) { return true; });  // a second graph sharing the pool
  EXPECT_EQ(m.id_of(kGraph), id);
  EXPECT_EQ(m.use_count(kGraph), 2);
  m.end(kGraph);
  m.release(kGraph);
  EXPECT_EQ(m.use_count(kGraph), 1);
  m.release(kGraph);
  EXPECT_EQ(m.use_count(kGraph), 0);
  EXPECT_EQ(pool_stats(id).released, 1u);
  EXPECT_EQ(pool_of(in), id) << "its tensors stay valid, and the pool's";
}

TEST_F(TorchAdapterTest, PoolRoutesWhatTheFilterAcceptsOnItsDeviceOnly) {
  ASSERT_EQ(expanse_shutdown(), EXPANSE_OK);
  ASSERT_EQ(expanse_init("driver:sim,sim_devices:2,sim_capacity:1GiB"), EXPANSE_OK);
  ta::PoolMap m;
  std::atomic<bool> accept{true};
  std::atomic<int> calls{0};
  m.begin(kGraph, [&](CUstream_st*) {
    ++calls;
    return accept.load();
  });
  void* a = alloc(MiB);
  accept = false;
  void* b = alloc(MiB);
  void* other = nullptr;
  ASSERT_EQ(expanse_malloc_checked(&other, MiB, 1, nullptr), EXPANSE_OK);
  EXPECT_EQ(pool_of(a), m.id_of(kGraph));
  EXPECT_EQ(pool_of(b), 0u);
  EXPECT_EQ(pool_of(other), 0u) << "a pool of device 0 routes device 0 only";
  EXPECT_EQ(calls.load(), 2);
  m.end(kGraph);
  (void)alloc(MiB);
  EXPECT_EQ(calls.load(), 2) << "an ended route's filter is not called";
  ASSERT_EQ(expanse_free_checked(other, 0, 1, nullptr), EXPANSE_OK);
}

TEST_F(TorchAdapterTest, PoolBeginTwiceAndEndWithoutBeginAreRefusedNamingThePair) {
  ta::PoolMap m;
  const std::string end = pool_error([&] { m.end(kGraph); });
  EXPECT_NE(end.find("endAllocateToPool: memory pool (1, 0) on device 0 is not being allocated to"),
            std::string::npos) << end;
  m.begin(kGraph, [](CUstream_st*) { return true; });
  const std::string twice = pool_error([&] { m.begin(kGraph, [](CUstream_st*) { return true; }); });
  EXPECT_NE(twice.find("memory pool (1, 0) on device 0 is being allocated to already"),
            std::string::npos) << twice;
  EXPECT_EQ(m.use_count(kGraph), 1) << "the refused begin changed nothing";
  m.end(kGraph);
  const std::string rel = pool_error([&] { m.release({0, 5, 0}); });
  EXPECT_NE(rel.find("releasePool: memory pool (5, 0) on device 0 does not exist"),
            std::string::npos) << rel;
  m.release(kGraph);
  const std::string again = pool_error([&] { m.release(kGraph); });
  EXPECT_NE(again.find("memory pool (1, 0) on device 0"), std::string::npos) << again;
  EXPECT_NE(again.find("released"), std::string::npos) << again;
}

TEST_F(TorchAdapterTest, PoolReleasedCannotBeBegunWhileExpanseHoldsItsMemory) {
  ta::PoolMap m;
  m.begin(kGraph, [](CUstream_st*) { return true; });
  const expanse_pool_id first = m.id_of(kGraph);
  void* out = alloc(MiB);  // a graph output still alive
  m.end(kGraph);
  m.release(kGraph);
  const std::string e = pool_error([&] { m.begin(kGraph, [](CUstream_st*) { return true; }); });
  EXPECT_NE(e.find("beginAllocateToPool: memory pool (1, 0) on device 0 was released"),
            std::string::npos) << e;
  EXPECT_NE(e.find("1 live blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("torch.cuda.empty_cache()"), std::string::npos) << e;
  const std::string inc = pool_error([&] { m.create_or_incref(kGraph); });
  EXPECT_NE(inc.find("createOrIncrefPool: memory pool (1, 0) on device 0 was released"),
            std::string::npos) << inc;
  EXPECT_EQ(ta::FilterTable::instance().held(), 0u) << "the refused begin's filter copy is gone";
  // Its tensor freed and its memory given back: PyTorch forgets such a pool, and the pair names
  // a new one.
  release(out);
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK);
  m.begin(kGraph, [](CUstream_st*) { return true; });
  EXPECT_NE(m.id_of(kGraph), first);
  EXPECT_EQ(m.use_count(kGraph), 1);
  m.end(kGraph);
}

TEST_F(TorchAdapterTest, PoolCreateOrIncrefIsMemPoolsUseCount) {
  ta::PoolMap m;
  m.create_or_incref(kMemPool);  // MemPool()
  EXPECT_EQ(m.use_count(kMemPool), 1);
  m.create_or_incref(kMemPool);  // a graph captured into it (graph._retain_pool)
  EXPECT_EQ(m.use_count(kMemPool), 2);
  m.begin(kMemPool, [](CUstream_st*) { return true; });  // use_mem_pool
  EXPECT_EQ(m.use_count(kMemPool), 3);
  void* p = alloc(4 * KiB);
  EXPECT_EQ(pool_of(p), m.id_of(kMemPool));
  m.end(kMemPool);
  m.release(kMemPool);  // use_mem_pool's exit
  m.release(kMemPool);
  EXPECT_EQ(m.use_count(kMemPool), 1);
  EXPECT_EQ(pool_stats(m.id_of(kMemPool)).use_count, 1);
  m.release(kMemPool);  // ~MemPool
  EXPECT_EQ(m.use_count(kMemPool), 0);
}

TEST(TorchAdapterFilters, TheCopyLivesUntilRemovedThenCallsAnswerNo) {
  ta::FilterTable& t = ta::FilterTable::instance();
  const size_t held = t.held();
  auto token = std::make_shared<int>(0);
  int calls = 0;
  void* ctx = t.add([token, &calls](CUstream_st*) {
    ++calls;
    return true;
  });
  EXPECT_EQ(token.use_count(), 2) << "the table owns a copy";
  EXPECT_EQ(t.held(), held + 1);
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, ctx), 1);
  EXPECT_EQ(calls, 1);
  t.remove(ctx);
  EXPECT_EQ(token.use_count(), 1) << "removed: the copy is destroyed";
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, ctx), 0) << "a late call answers no";
  EXPECT_EQ(calls, 1);
  // The slot is reused with a new generation: the old ctx still answers no.
  void* again = t.add([](CUstream_st*) { return true; });
  EXPECT_NE(again, ctx);
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, ctx), 0);
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, again), 1);
  t.remove(again);
  t.remove(again);  // twice: nothing
  EXPECT_EQ(t.held(), held);
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, nullptr), 0) << "a ctx never handed out";
}

TEST(TorchAdapterFilters, ThrowingFilterAnswersNo) {
  ta::FilterTable& t = ta::FilterTable::instance();
  void* ctx = t.add([](CUstream_st*) -> bool { throw std::runtime_error("no capture info"); });
  EXPECT_EQ(ta::FilterTable::trampoline(nullptr, ctx), 0);
  t.remove(ctx);
}

TEST(TorchAdapterFilters, RemoveWaitsForACallInFlight) {
  ta::FilterTable& t = ta::FilterTable::instance();
  std::atomic<bool> entered{false}, let_go{false}, removed{false};
  auto token = std::make_shared<int>(0);
  void* ctx = t.add([&, token](CUstream_st*) {
    entered = true;
    while (!let_go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  });
  std::thread caller([&] { EXPECT_EQ(ta::FilterTable::trampoline(nullptr, ctx), 1); });
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread remover([&] {
    t.remove(ctx);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load()) << "remove returned while the filter ran";
  EXPECT_EQ(token.use_count(), 2);
  let_go = true;
  caller.join();
  remover.join();
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(token.use_count(), 1);
}

TEST_F(TorchAdapterTest, PoolFilterCopyIsFreedWhenItsRouteEnds) {
  ta::PoolMap m;
  const size_t held = ta::FilterTable::instance().held();
  auto token = std::make_shared<int>(0);
  m.begin(kGraph, [token](CUstream_st*) { return true; });
  EXPECT_EQ(token.use_count(), 2);
  EXPECT_EQ(ta::FilterTable::instance().held(), held + 1);
  m.end(kGraph);
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_EQ(ta::FilterTable::instance().held(), held);
}

TEST_F(TorchAdapterTest, PoolMapGoneEndsItsRoutings) {
  const size_t held = ta::FilterTable::instance().held();
  auto token = std::make_shared<int>(0);
  expanse_pool_id id = 0;
  {
    ta::PoolMap m;
    m.begin(kGraph, [token](CUstream_st*) { return true; });
    id = m.id_of(kGraph);
  }
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_EQ(ta::FilterTable::instance().held(), held);
  EXPECT_EQ(pool_of(alloc(MiB)), 0u) << "no routing left";
  EXPECT_EQ(pool_stats(id).use_count, 1);
}

TEST_F(TorchAdapterTest, PoolEmptyCacheTrimsReleasedPoolsOnly) {
  ta::PoolMap m;
  m.begin(kGraph, [](CUstream_st*) { return true; });
  const expanse_pool_id id = m.id_of(kGraph);
  release(alloc(4 * MiB));  // freed in the capture: cached in the pool
  m.end(kGraph);
  const uint64_t cached = pool_stats(id).cached_bytes;
  EXPECT_GE(cached, 4 * MiB);
  m.empty_cache(kGraph.first, kGraph.second);
  EXPECT_EQ(pool_stats(id).cached_bytes, cached) << "a live pool keeps its memory";
  EXPECT_EQ(m.use_count(kGraph), 1);
  m.empty_cache(0, 7);  // a pair never created: nothing
  m.release(kGraph);
  m.empty_cache(kGraph.first, kGraph.second);
  EXPECT_EQ(stats().mapped_bytes, 0u) << "released: its memory went back to the driver";
  EXPECT_EQ(m.size(), 0u) << "nothing of it left: forgotten";
  EXPECT_EQ(m.use_count(kGraph), 0);
}

TEST_F(TorchAdapterTest, PoolForgetsFinishedPools) {
  ta::PoolMap m;
  m.create_or_incref(kMemPool);
  m.create_or_incref({0, 0, 2});
  m.release(kMemPool);
  EXPECT_EQ(m.size(), 2u);
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK);
  m.forget_finished();
  EXPECT_EQ(m.size(), 1u) << "the released one is gone, the live one stays";
  EXPECT_NE(m.id_of({0, 0, 2}), 0u);
}

TEST_F(TorchAdapterTest, PoolLiveAllocationsAreExactlyThePools) {
  ta::PoolMap m;
  m.begin(kGraph, [](CUstream_st*) { return true; });
  void* a = alloc(MiB);
  void* b = alloc(8 * KiB);
  m.end(kGraph);
  void* c = alloc(MiB);  // default pool
  using Set = std::unordered_set<void*>;
  EXPECT_TRUE(m.live_allocations_are(kGraph, Set{a, b}));
  EXPECT_FALSE(m.live_allocations_are(kGraph, Set{a})) << "b is live too";
  EXPECT_FALSE(m.live_allocations_are(kGraph, Set{a, b, c})) << "c is not the pool's";
  EXPECT_FALSE(m.live_allocations_are(kGraph, Set{}));
  EXPECT_FALSE(m.live_allocations_are(kGraph, Set{a, static_cast<char*>(b) + 512}));
  release(b);
  EXPECT_TRUE(m.live_allocations_are(kGraph, Set{a}));
  EXPECT_FALSE(m.live_allocations_are(kGraph, Set{a, b})) << "b was freed";
  release(a);
  EXPECT_TRUE(m.live_allocations_are(kGraph, Set{}));
  const std::string e = pool_error([&] { (void)m.live_allocations_are({0, 9, 0}, Set{}); });
  EXPECT_NE(e.find("memory pool (9, 0) on device 0 does not exist"), std::string::npos) << e;
}

TEST_F(TorchAdapterTest, PoolUseOnOomListsMarkedPoolsNewestFirst) {
  ta::PoolMap m;
  m.create_or_incref(kMemPool);
  m.create_or_incref({0, 0, 2});
  EXPECT_TRUE(m.use_on_oom(0).empty());
  m.set_use_on_oom(kMemPool, true);
  m.set_use_on_oom({0, 0, 2}, true);
  EXPECT_EQ(m.use_on_oom(0), (std::vector<expanse_pool_id>{m.id_of({0, 0, 2}), m.id_of(kMemPool)}));
  EXPECT_TRUE(m.use_on_oom(1).empty());
  m.set_use_on_oom({0, 0, 2}, false);
  EXPECT_EQ(m.use_on_oom(0), (std::vector<expanse_pool_id>{m.id_of(kMemPool)}));
  const std::string e = pool_error([&] { m.set_use_on_oom({0, 0, 3}, true); });
  EXPECT_NE(e.find("setUseOnOOM: memory pool (0, 3) on device 0 does not exist"),
            std::string::npos) << e;
}

}  // namespace
