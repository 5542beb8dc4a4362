// Thread caches (core/thread_cache.hpp, device_front.cpp): the cache itself against a reference
// model, the allocator's user-visible figures against a model of what users did, the hazards
// (double free, record_stream, other streams, pressure, thread exit, the allocator gone first)
// and many threads at once.
#include "core/front/cache_bypass.hpp"
#include "core/front/thread_cache.hpp"
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <random>
#include <thread>

namespace expanse::test {
namespace {

core::AllocatorOptions cached_opts(size_t bytes = 64 * MiB, size_t entries = 64) {
  core::AllocatorOptions o;
  o.thread_cache_bytes = bytes;
  o.thread_cache_entries = entries;
  return o;
}

// ---- the cache alone, against a model ----------------------------------------------------------

TEST(ThreadCacheModelTest, TakesNewestOfKeyAndEvictsOldestWithinBounds) {
  std::mt19937_64 rng(11);
  core::ThreadCache c;
  struct M {
    core::StreamKey key;
    core::CachedBlock b;
    uint64_t order;
  };
  std::vector<M> model;  // every parked block, in parking order
  uint64_t order = 0;
  CUdeviceptr next = 0x1000;
  const size_t max_bytes = 64 * KiB, max_entries = 12;
  for (int step = 0; step < 20000; ++step) {
    const core::StreamKey key = 1 + rng() % 3;
    const size_t requested = 512 * (1 + rng() % 6);
    if (rng() % 2 == 0) {
      core::CachedBlock b{next, (requested + 511) / 512 * 512, requested, nullptr, 0};
      next += 0x10000;
      std::vector<core::CachedBlock> evicted;
      c.put(key, b, max_bytes, max_entries, &evicted);
      model.push_back({key, b, ++order});
      // The model evicts the oldest until within both bounds.
      std::vector<CUdeviceptr> want;
      auto bytes = [&] {
        size_t n = 0;
        for (const M& m : model) n += m.b.size;
        return n;
      };
      while (model.size() > max_entries || bytes() > max_bytes) {
        want.push_back(model.front().b.addr);
        model.erase(model.begin());
      }
      ASSERT_EQ(evicted.size(), want.size()) << "step " << step;
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(evicted[i].addr, want[i]);
    } else {
      core::CachedBlock got;
      const bool hit = c.take(key, requested, &got);
      auto newest = model.end();
      for (auto it = model.begin(); it != model.end(); ++it) {
        if (it->key == key && it->b.requested == requested) newest = it;
      }
      ASSERT_EQ(hit, newest != model.end()) << "step " << step;
      if (hit) {
        ASSERT_EQ(got.addr, newest->b.addr) << "step " << step;
        model.erase(newest);
      }
    }
    size_t bytes = 0;
    for (const M& m : model) bytes += m.b.size;
    ASSERT_EQ(c.entries(), model.size());
    ASSERT_EQ(c.bytes(), bytes);
    ASSERT_LE(c.entries(), max_entries);
    ASSERT_LE(c.bytes(), max_bytes);
  }
  EXPECT_EQ(c.take_all().size(), model.size());
  EXPECT_EQ(c.entries(), 0u);
}

// ---- the allocator's figures, as users see them -------------------------------------------------

class ThreadCacheTest : public CoreTest {};

// Random allocations and frees on a few streams (frees mostly on the allocation stream, some on
// another, some after record_stream), from a small set of sizes so that caches hit: every figure
// users see (allocated and requested bytes, their peaks, counts) equals the model's, blocks never
// overlap, data survives, and the cache served most allocations (no stats call in between).
TEST_F(ThreadCacheTest, UserFiguresMatchAModelOfWhatUsersDid) {
  make(sim_config(1 * GiB), cached_opts(8 * MiB, 32));
  std::vector<CUstream> streams = {nullptr, new_stream(), new_stream(), CU_STREAM_PER_THREAD};
  std::mt19937_64 rng(5);
  const size_t sizes[] = {512, 1000, 4096, 70000, 1 * MiB, 3 * MiB + 5};
  struct Live {
    size_t n, size;
    CUstream s;
    uint64_t seed;
  };
  std::map<uintptr_t, Live> live;
  uint64_t allocated = 0, requested = 0, peak_alloc = 0, peak_req = 0, allocs = 0, frees = 0;
  core::DeviceStats before = alloc_->stats();
  const int steps = 30000;
  for (int step = 0; step < steps; ++step) {
    const int dice = static_cast<int>(rng() % 100);
    if (dice < 50 || live.empty()) {
      const size_t n = sizes[rng() % std::size(sizes)];
      CUstream s = streams[rng() % streams.size()];
      void* p = alloc_->allocate(n, s);
      const auto a = reinterpret_cast<uintptr_t>(p);
      const size_t sz = (n + 511) / 512 * 512;
      auto next = live.lower_bound(a);
      ASSERT_TRUE(next == live.end() || next->first >= a + sz) << "step " << step;
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.size, a) << "step " << step;
      }
      fill_pattern(p, n, static_cast<uint64_t>(step));
      live[a] = {n, sz, s, static_cast<uint64_t>(step)};
      allocated += sz;
      requested += n;
      peak_alloc = std::max(peak_alloc, allocated);
      peak_req = std::max(peak_req, requested);
      ++allocs;
    } else if (dice < 95) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_EQ(check_pattern(reinterpret_cast<void*>(it->first), it->second.n, it->second.seed),
                SIZE_MAX)
          << "step " << step;
      if (rng() % 16 == 0) alloc_->record_stream(reinterpret_cast<void*>(it->first), streams[1]);
      CUstream s = rng() % 8 == 0 ? streams[rng() % streams.size()] : it->second.s;
      alloc_->deallocate(reinterpret_cast<void*>(it->first), s, rng() % 2 ? it->second.n : 0);
      allocated -= it->second.size;
      requested -= it->second.n;
      ++frees;
      live.erase(it);
    } else if (dice < 97) {
      // A pointer freed already (parked or not) is refused, and nothing changes.
      if (rng() % 2 == 0 && !live.empty()) {
        auto it = live.begin();
        void* p = reinterpret_cast<void*>(it->first);
        alloc_->deallocate(p, it->second.s);
        EXPECT_THROW(alloc_->deallocate(p, it->second.s), usage_error) << "step " << step;
        EXPECT_FALSE(alloc_->owns(p));
        EXPECT_THROW(alloc_->record_stream(p, streams[2]), usage_error);
        allocated -= it->second.size;
        requested -= it->second.n;
        ++frees;
        live.erase(it);
      }
    } else {
      const core::DeviceStats st = alloc_->stats();
      ASSERT_EQ(st.allocated_bytes, allocated) << "step " << step;
      ASSERT_EQ(st.requested_bytes, requested) << "step " << step;
      ASSERT_EQ(st.peak_allocated_bytes, peak_alloc) << "step " << step;
      ASSERT_EQ(st.peak_requested_bytes, peak_req) << "step " << step;
      ASSERT_EQ(st.live_blocks, live.size()) << "step " << step;
      ASSERT_EQ(st.num_allocs - before.num_allocs, allocs) << "step " << step;
      ASSERT_EQ(st.num_frees - before.num_frees, frees) << "step " << step;
      if (rng() % 4 == 0) {
        alloc_->reset_peaks();
        peak_alloc = allocated;
        peak_req = requested;
      }
    }
  }
  for (const auto& [a, l] : live) alloc_->deallocate(reinterpret_cast<void*>(a), l.s);
  const core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.num_allocs - before.num_allocs, allocs);
  EXPECT_EQ(st.peak_allocated_bytes, peak_alloc);
  EXPECT_GT(st.thread_cache_hits, allocs / 10) << "the caches served too little to be tested";
  EXPECT_EQ(books_vs_driver(), "");
}

// The peak counts what users hold, not what caches hold; an allocation from a cache that lifts
// the users' total above the peak lifts the peak.
TEST_F(ThreadCacheTest, PeaksCountWhatUsersHoldOnly) {
  make(sim_config(1 * GiB, false), cached_opts());
  CUstream s = new_stream();
  void* a = alloc_->allocate(1 * MiB, s);
  void* b = alloc_->allocate(2 * MiB, s);
  alloc_->deallocate(a, s);  // parked
  alloc_->deallocate(b, s);  // parked
  alloc_->reset_peaks();     // users hold nothing
  void* c = alloc_->allocate(3 * MiB, s);      // from the books: users hold 3 MiB
  void* a2 = alloc_->allocate(1 * MiB, s);     // from the cache: users hold 4 MiB
  EXPECT_EQ(a2, a);
  alloc_->deallocate(a2, s);
  alloc_->deallocate(c, s);
  const core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.peak_allocated_bytes, 4 * MiB);
  EXPECT_EQ(st.peak_requested_bytes, 4 * MiB);
  EXPECT_EQ(st.allocated_bytes, 0u);
}

// A registrable block (its own path into the books) counts toward the peak what users hold, as
// any allocation does: not the blocks parked in thread caches (live in the books, freed for
// users), and it spends every thread's peak credit, so that a cache hit after it that raises
// what users hold raises the peak.
TEST_F(ThreadCacheTest, RegistrableAllocationsKeepPeaksToWhatUsersHold) {
  make(sim_config(256 * MiB, false), cached_opts());
  const size_t P = alloc_->page_size();
  CUstream s = new_stream();
  alloc_->create_pool(7, /*registrable=*/true);
  void* x = alloc_->allocate(1 * MiB, s);  // users hold 1 MiB: the peak
  alloc_->deallocate(x, s);                // parked; this thread's credit covers 1 MiB
  void* r = alloc_->allocate(1 * MiB, s, 7);  // one page, its own handle
  EXPECT_EQ(alloc_->stats().peak_allocated_bytes, P) << "the parked block counted as held";
  EXPECT_EQ(alloc_->stats().peak_requested_bytes, 1 * MiB);
  void* x2 = alloc_->allocate(1 * MiB, s);  // from the cache: users hold P + 1 MiB
  EXPECT_EQ(x2, x);
  EXPECT_EQ(alloc_->stats().peak_allocated_bytes, P + 1 * MiB)
      << "a credit earned before the registrable allocation hid the new peak";
  EXPECT_EQ(alloc_->stats().peak_requested_bytes, 2 * MiB);
  alloc_->deallocate(x2, s);
  alloc_->deallocate(r, s);
  alloc_->release_pool(7);
}

// Same stream and size only: another stream, another size, or a block another stream used gets
// no cached block.
TEST_F(ThreadCacheTest, HandsBackOnlyToTheSameStreamAndSize) {
  make(sim_config(1 * GiB, false), cached_opts());
  CUstream s1 = new_stream(), s2 = new_stream();
  void* p = alloc_->allocate(64 * KiB, s1);
  alloc_->deallocate(p, s1);
  void* q = alloc_->allocate(64 * KiB, s2);
  EXPECT_NE(q, p) << "a block freed on s1 went to s2 with s1's work unproven";
  void* r = alloc_->allocate(64 * KiB + 512, s1);
  EXPECT_NE(r, p);
  void* t = alloc_->allocate(64 * KiB, s1);
  EXPECT_EQ(t, p) << "the cache did not serve the same stream and size";
  alloc_->record_stream(t, s2);
  alloc_->deallocate(t, s1);  // s2 used it: pending on s2, never cached
  void* u = alloc_->allocate(64 * KiB, s1);
  EXPECT_NE(u, t);
  for (auto [x, s] : {std::pair{q, s2}, {r, s1}, {u, s1}}) alloc_->deallocate(x, s);
}

// Reading the stats leaves the caches alone (a client that polls them every step keeps its hits)
// and still tells what a flush would: every figure equals the one read after a flush (segments()
// flushes), on random workloads whose small blocks share pages with live and parked neighbours.
TEST_F(ThreadCacheTest, StatsTellWhatAFlushWouldWithoutFlushing) {
  make(sim_config(512 * MiB, false), cached_opts(16 * MiB, 32));
  std::vector<CUstream> streams = {new_stream(), new_stream()};
  std::mt19937_64 rng(17);
  const size_t sizes[] = {512, 100000, 700 * KiB, 1 * MiB, 2 * MiB, 3 * MiB + 512};
  std::vector<std::pair<void*, CUstream>> live;
  size_t compared = 0;
  for (int step = 0; step < 6000; ++step) {
    if (rng() % 100 < 52 || live.empty()) {
      CUstream s = streams[rng() % streams.size()];
      live.emplace_back(alloc_->allocate(sizes[rng() % std::size(sizes)], s), s);
    } else {
      const size_t i = rng() % live.size();
      alloc_->deallocate(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<long>(i));
    }
    if (rng() % 50 != 0) continue;
    const core::DeviceStats read = alloc_->stats();
    const core::DeviceStats again = alloc_->stats();  // reading twice changes nothing
    (void)alloc_->segments();                          // flushes every cache
    const core::DeviceStats flushed = alloc_->stats();
    ASSERT_EQ(read.live_blocks, live.size()) << "step " << step;
    for (const core::DeviceStats* st : {&read, &again}) {
      ASSERT_EQ(st->allocated_bytes, flushed.allocated_bytes) << "step " << step;
      ASSERT_EQ(st->requested_bytes, flushed.requested_bytes) << "step " << step;
      ASSERT_EQ(st->live_blocks, flushed.live_blocks) << "step " << step;
      ASSERT_EQ(st->num_allocs, flushed.num_allocs) << "step " << step;
      ASSERT_EQ(st->num_frees, flushed.num_frees) << "step " << step;
      ASSERT_EQ(st->touched_bytes, flushed.touched_bytes) << "step " << step;
      ASSERT_EQ(st->cached_bytes, flushed.cached_bytes) << "step " << step;
      ASSERT_EQ(st->mapped_bytes, flushed.mapped_bytes) << "step " << step;
      ASSERT_EQ(st->reserved_unused_bytes, flushed.reserved_unused_bytes) << "step " << step;
      ASSERT_EQ(st->peak_allocated_bytes, flushed.peak_allocated_bytes) << "step " << step;
      ASSERT_EQ(st->thread_cache_hits, flushed.thread_cache_hits) << "step " << step;
    }
    ++compared;
  }
  EXPECT_GT(compared, 50u);
  // Blocks were parked at the reads: many allocations came from the caches (fewer than half: a
  // small block that finds no mapped place takes the parked ones back first).
  EXPECT_GT(alloc_->stats().thread_cache_hits, 500u);
  for (auto [p, s] : live) alloc_->deallocate(p, s);
  EXPECT_EQ(books_vs_driver(), "");

  // A hit after a stats read: the block parked before it is still there.
  CUstream s = streams[0];
  void* p = alloc_->allocate(64 * KiB, s);
  alloc_->deallocate(p, s);  // parked
  const uint64_t hits = alloc_->stats().thread_cache_hits;
  EXPECT_EQ(alloc_->stats().live_blocks, 0u);
  void* q = alloc_->allocate(64 * KiB, s);
  EXPECT_EQ(q, p);
  alloc_->deallocate(q, s);
  EXPECT_EQ(alloc_->stats().thread_cache_hits, hits + 1) << "the stats read emptied the cache";
}

// reset_peaks racing a thread that frees and allocates one block through its cache: once an
// allocation returns, the peak is at least what users hold. A reset that zeroes the threads'
// credits and reads the parked blocks in two passes lets a block parked between them count as
// freed for the new peak while its credit survives, so the next hit skips the peak update.
TEST_F(ThreadCacheTest, ResetPeaksRacingParksNeverLeavesThePeakBelowWhatUsersHold) {
  make(sim_config(512 * MiB, false), cached_opts(64 * MiB, 64));
  const size_t S = 1 * MiB;
  std::atomic<bool> stop{false};
  std::atomic<size_t> below{0}, rounds{0};
  // Other threads' caches, full of parked blocks: a reset's passes over the caches take longer.
  std::vector<std::thread> fillers;
  std::atomic<int> filled{0};
  std::vector<CUstream> streams;
  for (int f = 0; f < 4; ++f) streams.push_back(new_stream());
  for (int f = 0; f < 3; ++f) {
    fillers.emplace_back([&, f] {
      CUstream s = streams[static_cast<size_t>(f)];
      std::vector<void*> got;
      for (int i = 0; i < 48; ++i) got.push_back(alloc_->allocate(4096 + 512 * i, s));
      for (void* p : got) alloc_->deallocate(p, s);
      filled.fetch_add(1);
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  while (filled.load() < 3) std::this_thread::yield();
  std::thread worker([&] {
    CUstream s = streams[3];
    alloc_->deallocate(alloc_->allocate(S, s), s);  // makes this thread's cache
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (size_t i = 0; i < 200000 && below.load() == 0; ++i) {
      if (i % 1024 == 0 && std::chrono::steady_clock::now() > until) break;  // slow builds
      void* p = alloc_->allocate(S, s);
      if (alloc_->stats().peak_allocated_bytes < S) below.fetch_add(1);
      alloc_->deallocate(p, s);
      rounds.fetch_add(1);
    }
    stop = true;
  });
  while (!stop) alloc_->reset_peaks();
  worker.join();
  for (auto& t : fillers) t.join();
  EXPECT_EQ(below.load(), 0u) << "after " << rounds.load() << " rounds";
}

// Memory parked in another thread's cache is reachable before any OOM: a thread fills its cache,
// another allocates what only fits once that cache is flushed.
TEST_F(ThreadCacheTest, AnOutOfMemoryFlushesEveryThreadsCacheFirst) {
  make(sim_config(256 * MiB, false), cached_opts(200 * MiB, 64));
  CUstream s1 = new_stream(), s2 = new_stream();
  std::thread t([&] {
    std::vector<void*> ps;
    for (int i = 0; i < 12; ++i) ps.push_back(alloc_->allocate(16 * MiB, s1));
    for (void* p : ps) alloc_->deallocate(p, s1);  // 192 MiB parked in this thread's cache
  });
  t.join();  // (the exit flushes too: keep a second one parked without exiting)
  std::atomic<bool> parked{false}, done{false};
  std::thread holder([&] {
    std::vector<void*> ps;
    for (int i = 0; i < 12; ++i) ps.push_back(alloc_->allocate(16 * MiB, s1));
    for (void* p : ps) alloc_->deallocate(p, s1);
    parked = true;
    while (!done) std::this_thread::yield();
  });
  while (!parked) std::this_thread::yield();
  void* big = nullptr;
  EXPECT_NO_THROW(big = alloc_->allocate(200 * MiB, s2));
  done = true;
  holder.join();
  alloc_->deallocate(big, s2);
  EXPECT_EQ(alloc_->stats().num_ooms, 0u);
}

// A thread's exit gives its cache back; an allocator destroyed before a thread with parked
// blocks exits is no harm to that exit.
TEST_F(ThreadCacheTest, ThreadExitGivesBackAndOutlivesTheAllocator) {
  make(sim_config(256 * MiB, false), cached_opts());
  CUstream s = new_stream();
  std::thread t([&] {
    for (int i = 0; i < 10; ++i) alloc_->deallocate(alloc_->allocate(1 * MiB, s), s);
  });
  t.join();
  const core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.num_allocs, 10u);
  EXPECT_EQ(st.num_frees, 10u);

  std::atomic<bool> parked{false}, gone{false};
  std::thread late([&] {
    alloc_->deallocate(alloc_->allocate(1 * MiB, s), s);
    parked = true;
    while (!gone) std::this_thread::yield();
  });  // exits after the allocator is destroyed
  while (!parked) std::this_thread::yield();
  alloc_.reset();
  gone = true;
  late.join();
}

// Nothing is cached or handed out while a capture is announced or a route exists (CacheBypass).
TEST_F(ThreadCacheTest, BypassedWhileACaptureOrRouteExists) {
  make(sim_config(256 * MiB, false), cached_opts());
  CUstream s = new_stream();
  void* p = alloc_->allocate(1 * MiB, s);
  alloc_->deallocate(p, s);  // parked
  core::CacheBypass::enter();
  void* q = alloc_->allocate(1 * MiB, s);
  EXPECT_NE(q, p) << "a cached block was handed out while a capture may be recording";
  alloc_->deallocate(q, s);  // not parked: the locked path
  core::CacheBypass::leave();
  void* r = alloc_->allocate(1 * MiB, s);
  EXPECT_EQ(r, p);
  alloc_->deallocate(r, s);
}

// ---- many threads at once ------------------------------------------------------------------------
// A stream destroyed with blocks parked under it, its handle value taken by a new stream: the new
// stream has a new identity, so gets none of them, and once they go back to the books (a flush)
// no stream reuses them while the old stream's work may still run (only a synchronize proves it).
TEST_F(ThreadCacheTest, BlocksParkedUnderADestroyedStreamWaitForItsWork) {
  make(sim_config(256 * MiB, false), cached_opts());
  const auto& t = drv_->table();
  CUstream s1 = new_stream();
  void* x = alloc_->allocate(4 * MiB, s1);
  sim::hold_stream(s1);  // its work (and the record the free is ordered after) stays pending
  alloc_->deallocate(x, s1);  // parked under s1
  ASSERT_EQ(t.stream_destroy(s1), CUDA_SUCCESS);
  streams_.erase(std::find(streams_.begin(), streams_.end(), s1));
  CUstream s2 = new_stream();  // usually s1's handle value again
  const auto xa = reinterpret_cast<uintptr_t>(x);
  void* y = alloc_->allocate(4 * MiB, s2);
  EXPECT_NE(y, x) << "a block parked under a destroyed stream went to the stream taking its handle";
  (void)alloc_->segments();  // flushes: x is freed into the books, on the destroyed stream
  void* z = alloc_->allocate(4 * MiB, s2);
  const auto za = reinterpret_cast<uintptr_t>(z);
  EXPECT_FALSE(za < xa + 4 * MiB && xa < za + 4 * MiB)
      << "reused while the destroyed stream's work was pending";
  alloc_->deallocate(y, s2);
  alloc_->deallocate(z, s2);
  sim::release_all();
}

// A stream captured by another thread, the capture not announced (no expanse_capture_begin, no
// route): the capturing stream is asked for at every call, so no block parked before the capture
// is handed to it (its graph would use default-pool memory at every replay), and a block freed on
// it during the capture is not parked (the graph's work on it runs at replays).
TEST_F(ThreadCacheTest, AnUnannouncedCaptureGetsNoParkedBlockAndParksNothing) {
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_RELAXED,
                                   CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                   CU_STREAM_CAPTURE_MODE_GLOBAL}) {
    make(sim_config(256 * MiB, false), cached_opts());
    const auto& t = drv_->table();
    CUstream s = new_stream();
    void* before = alloc_->allocate(1 * MiB, s);  // live across the capture
    void* x = alloc_->allocate(1 * MiB, s);
    alloc_->deallocate(x, s);  // parked under s
    std::atomic<int> phase{0};  // 1: capturing; 2: this thread is done with the capture
    CUresult ended = CUDA_ERROR_UNKNOWN;
    std::thread capturer([&] {
      PrimaryCtx c(t);
      const bool began = t.stream_begin_capture(s, mode) == CUDA_SUCCESS;
      phase = 1;
      if (!began) return;  // `ended` stays an error
      while (phase.load() != 2) std::this_thread::yield();
      CUgraph g = nullptr;
      ended = t.stream_end_capture(s, &g);
      if (g != nullptr) t.graph_destroy(g);
    });
    while (phase.load() != 1) std::this_thread::yield();
    void* in = alloc_->allocate(1 * MiB, s);
    EXPECT_NE(in, x) << "mode " << mode << ": a parked block went into a capture";
    alloc_->deallocate(before, s);  // during the capture
    alloc_->deallocate(in, s);
    phase = 2;
    capturer.join();
    ASSERT_EQ(ended, CUDA_SUCCESS) << "mode " << mode << ": " << sim::capture_log();
    std::vector<void*> after;
    for (int i = 0; i < 3; ++i) after.push_back(alloc_->allocate(1 * MiB, s));
    for (void* p : {before, in}) {
      EXPECT_TRUE(std::find(after.begin(), after.end(), p) == after.end())
          << "mode " << mode << ": a block freed during the capture was parked";
    }
    for (void* p : after) alloc_->deallocate(p, s);
    alloc_->capture_ended(s);
  }
}

// A pool's block is never parked for the default pool, nor a default block handed to a pool.
TEST_F(ThreadCacheTest, PoolBlocksAndDefaultBlocksNeverCross) {
  make(sim_config(256 * MiB, false), cached_opts());
  CUstream s = new_stream();
  alloc_->create_pool(3);
  void* p = alloc_->allocate(1 * MiB, s, 3);
  alloc_->deallocate(p, s);
  void* d = alloc_->allocate(1 * MiB, s);
  EXPECT_NE(d, p) << "a pool's block went to the default pool";
  alloc_->deallocate(d, s);  // parked
  void* q = alloc_->allocate(1 * MiB, s, 3);
  EXPECT_NE(q, d) << "a parked default block went to a pool";
  alloc_->deallocate(q, s);
  void* d2 = alloc_->allocate(1 * MiB, s);
  EXPECT_EQ(d2, d);
  alloc_->deallocate(d2, s);
  alloc_->release_pool(3);
}

// record_stream racing the block's own free on another thread (the application's race: it
// names a block it may be freeing): either record_stream comes first (the free then waits for
// the other stream, nothing parked) or it fails (the block is freed). It must never take the
// block's front entry away once the free has parked it: the cache would then hold a block with
// no entry, and the next hit would write through a dangling one.
TEST_F(ThreadCacheTest, RecordStreamRacingTheFreeNeverStripsAParkedBlock) {
  make(sim_config(256 * MiB, false), cached_opts());
  CUstream s1 = new_stream(), s2 = new_stream();
  std::atomic<void*> shown{nullptr};
  std::atomic<bool> stop{false};
  std::atomic<size_t> recorded{0}, refused{0};
  std::thread owner([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (size_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
      void* p = alloc_->allocate(64 * KiB, s1);
      shown.store(p);
      for (int spin = 0; spin < static_cast<int>(i % 64); ++spin) std::this_thread::yield();
      alloc_->deallocate(p, s1);
      for (int spin = 0; spin < 4; ++spin) std::this_thread::yield();  // parked a while
    }
    stop = true;
  });
  std::atomic<size_t> stripped{0};
  std::thread recorder([&] {
    while (!stop) {
      void* q = shown.load();
      if (q == nullptr) continue;
      try {
        alloc_->record_stream(q, s2);
        recorded.fetch_add(1);
        if (!alloc_->check_invariants().empty()) stripped.fetch_add(1);
      } catch (const usage_error&) {
        refused.fetch_add(1);
      }
    }
  });
  owner.join();
  recorder.join();
  EXPECT_EQ(stripped.load(), 0u) << recorded.load() << " records, " << refused.load() << " refused";
  EXPECT_EQ(alloc_->check_invariants(), "");
  EXPECT_GT(recorded.load(), 0u);
  EXPECT_GT(refused.load(), 0u);
}


// Threads on their own streams and on shared ones, freeing their blocks and each other's (through
// a mailbox), while one thread calls release_cached and stats and another makes the device run
// out of memory now and then: no block handed out twice (patterns intact), the books exact.
TEST_F(ThreadCacheTest, ManyThreadsSharedStreamsCrossFreesAndPressure) {
  make(sim_config(512 * MiB), cached_opts(16 * MiB, 32));
  const char* env = std::getenv("EXPANSE_CONCURRENCY_OPS");
  const size_t ops = env != nullptr ? std::strtoull(env, nullptr, 10) : 20000;
  const int threads = 6;
  std::vector<CUstream> own, shared = {new_stream(), new_stream()};
  for (int t = 0; t < threads; ++t) own.push_back(new_stream());
  struct Block {
    void* p;
    size_t n;
    uint64_t seed;
    CUstream s;
  };
  std::mutex mail_mu;
  std::deque<Block> mail;  // blocks one thread hands another to free
  std::atomic<size_t> corrupt{0}, ooms{0}, hits_seen{0};
  std::atomic<bool> stop{false};
  const size_t sizes[] = {512, 4096, 65536, 1 * MiB, 1 * MiB + 512, 4 * MiB};
  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<uint64_t>(id) * 104729 + 3);
    std::vector<Block> live;
    for (size_t i = 0; i < ops; ++i) {
      const int dice = static_cast<int>(rng() % 100);
      if (dice < 50 && live.size() < 48) {
        const size_t n = sizes[rng() % std::size(sizes)];
        CUstream s = rng() % 4 == 0 ? shared[rng() % 2] : own[static_cast<size_t>(id)];
        try {
          void* p = alloc_->allocate(n, s);
          const uint64_t seed = (static_cast<uint64_t>(id) << 40) | i;
          fill_pattern(p, n, seed);
          live.push_back({p, n, seed, s});
        } catch (const out_of_memory&) {
          ooms.fetch_add(1);
        }
      } else if (dice < 90 && !live.empty()) {
        const size_t k = rng() % live.size();
        Block b = live[k];
        live[k] = live.back();
        live.pop_back();
        if (check_pattern(b.p, b.n, b.seed) != SIZE_MAX) corrupt.fetch_add(1);
        if (rng() % 8 == 0) {
          std::lock_guard<std::mutex> l(mail_mu);
          mail.push_back(b);  // another thread frees it
          continue;
        }
        alloc_->deallocate(b.p, rng() % 8 == 0 ? shared[rng() % 2] : b.s);
      } else {
        Block b{};
        {
          std::lock_guard<std::mutex> l(mail_mu);
          if (mail.empty()) continue;
          b = mail.front();
          mail.pop_front();
        }
        if (check_pattern(b.p, b.n, b.seed) != SIZE_MAX) corrupt.fetch_add(1);
        alloc_->deallocate(b.p, b.s);
      }
    }
    for (const Block& b : live) {
      if (check_pattern(b.p, b.n, b.seed) != SIZE_MAX) corrupt.fetch_add(1);
      alloc_->deallocate(b.p, b.s);
    }
  };
  std::thread flusher([&] {
    while (!stop) {
      alloc_->release_cached();
      (void)alloc_->stats();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::thread hog([&] {
    CUstream s = shared[0];
    while (!stop) {
      std::vector<void*> got;
      try {
        for (;;) got.push_back(alloc_->allocate(32 * MiB, s));
      } catch (const out_of_memory&) {
      }
      for (void* p : got) alloc_->deallocate(p, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& th : pool) th.join();
  stop = true;
  flusher.join();
  hog.join();
  for (const Block& b : mail) {
    if (check_pattern(b.p, b.n, b.seed) != SIZE_MAX) corrupt.fetch_add(1);
    alloc_->deallocate(b.p, b.s);
  }
  EXPECT_EQ(corrupt.load(), 0u);
  const core::DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.num_allocs, st.num_frees);
  EXPECT_GT(st.thread_cache_hits, 0u);
  EXPECT_EQ(alloc_->check_invariants(), "");
  std::printf("%zu worker OOMs (the hog runs the device out now and then), %llu of %llu "
              "allocations from thread caches\n",
              ooms.load(), static_cast<unsigned long long>(st.thread_cache_hits),
              static_cast<unsigned long long>(st.num_allocs));
}

// wake_pool needs pages: memory parked in a thread cache is free memory, so a wake flushes the
// caches before its page search (which cannot reclaim touched pages) gives up.
TEST_F(ThreadCacheTest, WakeFlushesTheCachesBeforeRunningOutOfMemory) {
  for (bool caches : {false, true}) {
    make(sim_config(64 * MiB, false), caches ? cached_opts(64 * MiB, 64) : core::AllocatorOptions{});
    CUstream s = new_stream();
    alloc_->create_pool(1);
    void* pooled = alloc_->allocate(16 * MiB, s, 1);
    ASSERT_TRUE(alloc_->sleep_pool(1, core::DeviceAllocator::SleepMode::discard));
    std::vector<void*> ps;
    for (int i = 0; i < 4; ++i) ps.push_back(alloc_->allocate(16 * MiB, s));
    for (void* p : ps) alloc_->deallocate(p, s);  // parked when caches are on
    EXPECT_NO_THROW(alloc_->wake_pool(1)) << "caches " << caches;
    alloc_->deallocate(pooled, s);
    alloc_->release_pool(1);
    alloc_.reset();
  }
}

}  // namespace
}  // namespace expanse::test
