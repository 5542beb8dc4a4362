// The memory history round-trips a run: the snapshot expanse writes, read back by the project's
// own snapshot reader, gives the run's peak live bytes (expanse's stats) and the blocks that were
// live when recording began, exactly. With what a PyTorch training run does to it: thread caches
// on (blocks parked in them when recording begins), several threads allocating and freeing,
// blocks freed on another thread's legacy stream (PyTorch's autograd thread), blocks used by a
// second stream (record_stream) whose work is held, so that their frees still wait at the dump.
// And recording that begins while threads hit and park in their caches loses or delays no
// event. Runs on both drivers (TwoDrivers).
#include "expanse/expanse.h"
#include "trace/trace.hpp"
#include "two_drivers_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;

CUstream_st* S(CUstream s) { return reinterpret_cast<CUstream_st*>(s); }

class HistoryRoundTrip : public expanse::test::TwoDrivers {
 protected:
  void TearDown() override {
    expanse_record_history(0, 0);  // the history is the process's: later tests record nothing
    TwoDrivers::TearDown();
  }
};

struct Held {
  void* p;
  size_t n;
};

// Blocks one thread hands to another, which frees them on its own legacy stream.
class Handoff {
 public:
  void put(Held h) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.push_back(h);
  }
  bool take(Held* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (blocks_.empty()) return false;
    *out = blocks_.back();
    blocks_.pop_back();
    return true;
  }
  std::vector<Held> rest() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(blocks_);
  }

 private:
  std::mutex mu_;
  std::vector<Held> blocks_;
};

// Workers wait here until recording has begun.
class Gate {
 public:
  void arrive_and_wait_open() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void wait_for(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ == n; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool open_ = false;
};

// Threads joined however the test leaves (an ASSERT returns early), `release` called first so
// that none waits for what the test no longer does.
class Threads {
 public:
  explicit Threads(std::function<void()> release) : release_(std::move(release)) {}
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;
  ~Threads() { join(); }
  template <class F>
  void add(F&& f) {
    threads_.emplace_back(std::forward<F>(f));
  }
  void join() {
    release_();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::function<void()> release_;
  std::vector<std::thread> threads_;
};

// Blocks of device 0 freed and waiting for other streams' work (no other thread runs).
size_t awaiting_blocks() {
  size_t ns = 0, nb = 0;
  EXPECT_EQ(expanse_get_segments(0, nullptr, &ns, nullptr, &nb), EXPANSE_OK);
  std::vector<expanse_segment_info> segs(ns);
  std::vector<expanse_block_info> blocks(nb);
  EXPECT_EQ(expanse_get_segments(0, segs.data(), &ns, blocks.data(), &nb), EXPANSE_OK)
      << expanse_last_error();
  size_t n = 0;
  for (const expanse_block_info& b : blocks) n += b.state == EXPANSE_BLOCK_AWAITING_FREE ? 1 : 0;
  return n;
}

TEST_P(HistoryRoundTrip, PeakAndBlocksBeforeRecordingWithThreadsAndHeldStreams) {
  start("sim_capacity:2GiB");  // thread caches on: the library's default
  CUstream s1 = stream(), s2 = stream(), s3 = stream();
  hold_(s2);  // work on s2 never completes before the dump: frees waiting for it stay waiting

  auto must_malloc = [](size_t n, CUstream s) {
    void* p = expanse_malloc(n, 0, S(s));
    EXPECT_NE(p, nullptr) << expanse_last_error();
    return p;
  };
  auto must_free = [](void* p, size_t n, CUstream s) {
    EXPECT_EQ(expanse_free_checked(p, n, 0, S(s)), EXPANSE_OK) << expanse_last_error();
  };

  // Before recording. Blocks live to the end: sizes are whole 512 B units, since the reader
  // sizes a block live at the end without a recorded alloc from its segment, as carved.
  std::vector<Held> kept = {{nullptr, 4096}, {nullptr, 600 * 512}, {nullptr, 2 * MiB},
                            {nullptr, 3 * MiB + 512}};
  auto kept_stream = [&](size_t i) { return i % 2 == 0 ? nullptr : s1; };
  for (size_t i = 0; i < kept.size(); ++i) kept[i].p = must_malloc(kept[i].n, kept_stream(i));
  // Blocks freed while recording: on the legacy stream by other threads (waiting for this
  // thread's legacy stream), and on s1 after s2 used them (waiting for s2 at the dump).
  std::vector<Held> pre_legacy = {{nullptr, 1000}, {nullptr, 70001}, {nullptr, 5 * MiB + 3}};
  for (Held& h : pre_legacy) h.p = must_malloc(h.n, nullptr);
  std::vector<Held> pre_s2 = {{nullptr, 8192 + 7}, {nullptr, 3 * MiB + 11}};
  for (Held& h : pre_s2) {
    h.p = must_malloc(h.n, s1);
    ASSERT_EQ(expanse_record_stream(h.p, S(s2)), EXPANSE_OK) << expanse_last_error();
  }

  constexpr int kWorkers = 4;
  constexpr int kSteps = 120;
  const CUstream worker_stream[kWorkers] = {nullptr, nullptr, s1, s3};
  const size_t sizes[] = {1000, 4096, 70000, 300 * 1024 + 5, 3 * MiB / 2 + 3, 3 * MiB + 7};
  constexpr size_t kSizes = sizeof sizes / sizeof sizes[0];
  Handoff handoff;
  Gate gate;
  std::atomic<uint64_t> allocs{0}, frees{0};
  std::vector<std::vector<Held>> left(kWorkers);  // live at the end
  Threads workers([&] { gate.open(); });
  for (int w = 0; w < kWorkers; ++w) {
    workers.add([&, w] {
      const CUstream s = worker_stream[w];
      // Blocks parked in this thread's cache when recording begins: freed before it, they are
      // no part of the trace.
      for (size_t i = 0; i < 3; ++i) {
        const size_t n = sizes[(static_cast<size_t>(w) + i) % kSizes];
        must_free(must_malloc(n, s), n, s);
      }
      gate.arrive_and_wait_open();
      std::vector<Held> mine;
      for (int i = 0; i < kSteps; ++i) {
        const size_t n = sizes[(static_cast<size_t>(i) * 7 + static_cast<size_t>(w)) % kSizes];
        mine.push_back({must_malloc(n, s), n});
        allocs.fetch_add(1);
        if (i % 3 == 2) {  // the oldest it holds, on its own stream
          must_free(mine.front().p, mine.front().n, s);
          mine.erase(mine.begin());
          frees.fetch_add(1);
        }
        if (i % 5 == 0) {  // to another thread
          handoff.put(mine.back());
          mine.pop_back();
        }
        Held h{};
        if (i % 4 == 1 && handoff.take(&h)) {  // another thread's, on this one's legacy stream
          must_free(h.p, h.n, nullptr);
          frees.fetch_add(1);
        }
        if (i == 10 && w < 2) {  // a block the main thread allocated before recording
          const Held& pre = pre_legacy[static_cast<size_t>(w)];
          must_free(pre.p, pre.n, nullptr);
          frees.fetch_add(1);
        }
        if (w == 2 && i % 40 == 20) {  // used by s2 too: its free waits for s2
          void* p = must_malloc(2 * MiB + 5, s);
          allocs.fetch_add(1);
          EXPECT_EQ(expanse_record_stream(p, S(s2)), EXPANSE_OK) << expanse_last_error();
          must_free(p, 2 * MiB + 5, s);
          frees.fetch_add(1);
          if (i == 20) {
            for (const Held& pre : pre_s2) {
              must_free(pre.p, pre.n, s);
              frees.fetch_add(1);
            }
          }
        }
      }
      left[static_cast<size_t>(w)] = std::move(mine);
    });
  }
  gate.wait_for(kWorkers);  // every worker's cache holds blocks now
  ASSERT_EQ(expanse_reset_peak_stats(0), EXPANSE_OK);
  ASSERT_EQ(expanse_record_history(1, 1u << 20), EXPANSE_OK) << expanse_last_error();
  gate.open();
  workers.join();
  // The third pre-recording legacy block, freed by a thread of its own.
  std::thread([&] {
    must_free(pre_legacy[2].p, pre_legacy[2].n, nullptr);
    frees.fetch_add(1);
  }).join();

  expanse_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  // The dump must find frees still waiting for streams, or this test shows nothing.
  EXPECT_GT(awaiting_blocks(), 0u);

  const std::string path = ::testing::TempDir() + "expanse_history_round_trip_" + GetParam() +
                           ".pickle";
  ASSERT_EQ(expanse_dump_snapshot(path.c_str()), EXPANSE_OK) << expanse_last_error();
  std::ifstream in(path, std::ios::binary);
  std::stringstream data;
  data << in.rdbuf();
  std::remove(path.c_str());
  const expanse::trace::Trace t = expanse::trace::load_snapshot(path, data.str());

  EXPECT_EQ(t.allocs, allocs.load());
  EXPECT_EQ(t.frees, frees.load());
  EXPECT_EQ(t.peak_live_bytes, st.peak_requested_bytes);
  EXPECT_EQ(t.live_at_end_bytes, st.requested_bytes);
  // The blocks live when recording began, no more: (size, live at the end) by address.
  std::map<uintptr_t, std::pair<uint64_t, bool>> want, found;
  for (const Held& h : kept) want[reinterpret_cast<uintptr_t>(h.p)] = {h.n, true};
  for (const Held& h : pre_legacy) want[reinterpret_cast<uintptr_t>(h.p)] = {h.n, false};
  for (const Held& h : pre_s2) want[reinterpret_cast<uintptr_t>(h.p)] = {h.n, false};
  ASSERT_TRUE(t.torch.has_value());
  for (const auto& p : t.torch->preexisting) {
    EXPECT_TRUE(found.emplace(p.addr, std::make_pair(p.size, p.live_at_end)).second)
        << "two blocks allocated before recording at " << p.addr;
  }
  EXPECT_EQ(found, want);
  EXPECT_EQ(t.preexisting, want.size());

  expanse_record_history(0, 0);
  for (size_t i = 0; i < kept.size(); ++i) must_free(kept[i].p, kept[i].n, kept_stream(i));
  for (size_t w = 0; w < left.size(); ++w) {
    for (const Held& h : left[w]) must_free(h.p, h.n, worker_stream[w]);
  }
  for (const Held& h : handoff.rest()) must_free(h.p, h.n, nullptr);
}

// Recording begins while threads allocate and free through their caches, over and over: a free
// that parks its block as recording begins is either before it (no event) or recorded when it
// is made, on its stream; never left parked and recorded later by whoever flushes the caches,
// on no stream. Each thread frees on a stream of its own, so every recorded free must name one,
// and a thread's blocks come and go in turn at their addresses.
TEST_P(HistoryRoundTrip, ThreadCachesRacingTheStartOfRecordingRecordEveryFreeOnItsStream) {
  start("sim_capacity:1GiB");
  constexpr int kWorkers = 2;
  constexpr int kStarts = 40;  // a park racing a start shows within 20 (2 cores, 2 threads)
  std::vector<CUstream> streams;
  for (int w = 0; w < kWorkers; ++w) streams.push_back(stream());
  std::atomic<bool> stop{false}, failed{false};
  std::vector<std::atomic<uint64_t>> pairs(kWorkers);
  Threads workers([&] { stop.store(true); });
  for (int w = 0; w < kWorkers; ++w) {
    workers.add([&, w] {
      const size_t n = 4096 + 512 * static_cast<size_t>(w);
      CUstream_st* s = S(streams[static_cast<size_t>(w)]);
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = expanse_malloc(n, 0, s);
        if (p == nullptr || expanse_free_checked(p, n, 0, s) != EXPANSE_OK) {
          ADD_FAILURE() << expanse_last_error();
          failed.store(true);
          return;
        }
        pairs[static_cast<size_t>(w)].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  auto wait_for_pairs = [&](uint64_t more) {
    for (auto& c : pairs) {
      const uint64_t until = c.load() + more;
      while (c.load() < until && !failed.load()) std::this_thread::yield();
    }
  };
  std::vector<expanse_trace_entry> trace;
  for (int i = 0; i < kStarts && !HasFailure(); ++i) {
    wait_for_pairs(20);  // back in their caches: freeing parks, allocating hits
    ASSERT_EQ(expanse_record_history(1, 1u << 16), EXPANSE_OK) << expanse_last_error();
    wait_for_pairs(1);  // a park racing the start has put its block in the cache by now
    // Reading the segments flushes every cache: a block parked since recording began would
    // have its free recorded now.
    size_t ns = 0, nb = 0;
    ASSERT_EQ(expanse_get_segments(0, nullptr, &ns, nullptr, &nb), EXPANSE_OK);
    ASSERT_EQ(expanse_record_history(0, 0), EXPANSE_OK);
    size_t ne = 0;
    ASSERT_EQ(expanse_get_trace(0, nullptr, &ne), EXPANSE_OK);
    trace.resize(ne);
    ASSERT_EQ(expanse_get_trace(0, trace.data(), &ne), EXPANSE_OK);
    std::map<uint64_t, uint32_t> last;  // address -> its latest alloc / free_completed
    for (const expanse_trace_entry& e : trace) {
      if (e.action != EXPANSE_TRACE_ALLOC && e.action != EXPANSE_TRACE_FREE_COMPLETED) continue;
      if (e.action == EXPANSE_TRACE_FREE_COMPLETED) {
        EXPECT_NE(std::find(streams.begin(), streams.end(), reinterpret_cast<CUstream>(e.stream)),
                  streams.end())
            << "start " << i << ": the free of " << e.addr << " names stream " << e.stream;
      }
      auto [it, first] = last.emplace(e.addr, e.action);
      if (!first) {
        EXPECT_NE(it->second, e.action) << "start " << i << ": two of the same in a row at "
                                        << e.addr;
        it->second = e.action;
      }
    }
  }
  workers.join();
}

INSTANTIATE_TEST_SUITE_P(Drivers, HistoryRoundTrip, ::testing::Values("sim", "simcuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
