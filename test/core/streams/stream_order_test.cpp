// Invariant 3: a block freed on stream S is reused at once on S, on other streams only after S's
// work up to the free has completed; pages are never unmapped under pending work.
#include "core_fixture.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace expanse::test {
namespace {

class StreamOrderTest : public CoreTest {};

bool overlaps(void* a, size_t an, void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

TEST_F(StreamOrderTest, SameStreamReusesAtOnceWithoutDriverCalls) {
  make(sim_config(4 * GiB));
  CUstream s = new_stream();
  void* a = alloc_->allocate(3 * MiB, s);
  sim::hold_stream(s);  // work on s still running: irrelevant for reuse on s itself
  alloc_->deallocate(a, s);
  uint64_t calls = work_calls();
  void* b = alloc_->allocate(3 * MiB, s);
  EXPECT_EQ(a, b);
  EXPECT_EQ(work_calls(), calls);
  alloc_->deallocate(b, s);
  sim::release_stream(s);
}

// A freed block's memory serves the next request of any size on its stream (once its work is
// done, as here, when the request needs its handle split): it was parked out of placement's
// reach for exact-size reuse, and a request of another size got new pages beside it (on the
// shared traces: physical memory up to 8 % of peak live above PyTorch's).
TEST_F(StreamOrderTest, FreedMemoryServesOtherSizesOnItsStreamWithoutNewPages) {
  make(sim_config(4 * GiB));
  CUstream s = new_stream();
  void* a = alloc_->allocate(64 * MiB, s);
  alloc_->deallocate(a, s);
  const core::DeviceStats before = alloc_->stats();
  void* b = alloc_->allocate(48 * MiB, s);
  const core::DeviceStats after = alloc_->stats();
  EXPECT_TRUE(overlaps(a, 64 * MiB, b, 48 * MiB)) << "the freed block's memory was not used";
  EXPECT_LE(after.peak_physical_bytes, before.peak_physical_bytes);
  // The same size again goes back where it was freed, with no driver call.
  alloc_->deallocate(b, s);
  const uint64_t calls = work_calls();
  void* c = alloc_->allocate(48 * MiB, s);
  EXPECT_EQ(c, b);
  EXPECT_EQ(work_calls(), calls);
  alloc_->deallocate(c, s);
}

// Memory s1 freed and proved done is not handed to s2 by a free of s2's beside it: s1 reuses it
// in place at once instead of waiting for a fence on s2, which only s2's own calls record.
// (Was: the safe block merged into s2's free memory and s1's next pass mapped new pages.)
TEST_F(StreamOrderTest, MemoryProvedFreeStaysUsableWhenAnotherStreamFreesBesideIt) {
  make(sim_config(4 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(8 * MiB, s1);
  void* b = alloc_->allocate(8 * MiB, s2);
  ASSERT_EQ(static_cast<char*>(a) + 8 * MiB, static_cast<char*>(b)) << "not neighbours";
  alloc_->deallocate(a, s1);
  // A call on s1 that needs new pages polls: s1's work is done, so `a` becomes safe.
  void* big = alloc_->allocate(100 * MiB, s1);
  ASSERT_NE(alloc_->describe_stream_order(a).find(" safe"), std::string::npos)
      << alloc_->describe_stream_order(a);
  sim::hold_stream(s2);  // s2's free stays unproven
  alloc_->deallocate(b, s2);
  const uint64_t calls = work_calls();
  void* again = alloc_->allocate(8 * MiB, s1);
  EXPECT_EQ(again, a) << alloc_->describe_stream_order(a);
  EXPECT_FALSE(overlaps(again, 8 * MiB, b, 8 * MiB)) << "reused s2's unproven free on s1";
  EXPECT_EQ(work_calls(), calls);
  alloc_->deallocate(again, s1);
  alloc_->deallocate(big, s1);
  sim::release_stream(s2);
}

TEST_F(StreamOrderTest, OtherStreamWaitsForTheFreeingStreamsWork) {
  make(sim_config(4 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(8 * MiB, s1);
  sim::hold_stream(s1);
  alloc_->deallocate(a, s1);
  // While s1's work is pending, nothing allocated on s2 may overlap a.
  std::vector<void*> got;
  for (int i = 0; i < 8; ++i) {
    void* b = alloc_->allocate(8 * MiB, s2);
    EXPECT_FALSE(overlaps(a, 8 * MiB, b, 8 * MiB)) << "reused on s2 before s1's work completed";
    got.push_back(b);
  }
  for (void* b : got) alloc_->deallocate(b, s2);
  sim::release_stream(s1);
  // Once s1's work is done the memory is everyone's again: with the device otherwise full, s2
  // gets it.
  void* big = alloc_->allocate(4 * GiB - 8 * MiB, s2);
  EXPECT_NE(big, nullptr);
  alloc_->deallocate(big, s2);
}

TEST_F(StreamOrderTest, RecordStreamDefersReuseEvenOnTheOwningStream) {
  make(sim_config(4 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(4 * MiB, s1);
  alloc_->record_stream(a, s2);
  sim::hold_stream(s2);
  alloc_->deallocate(a, s1);
  void* b = alloc_->allocate(4 * MiB, s1);
  EXPECT_FALSE(overlaps(a, 4 * MiB, b, 4 * MiB)) << "reused while s2 may still use it";
  alloc_->deallocate(b, s1);
  sim::release_stream(s2);
  // s2's handle is not touched from s1's calls (it may have been destroyed); s2's own next call
  // fences its work, after which the block is everyone's again.
  alloc_->deallocate(alloc_->allocate(512, s2), s2);
  EXPECT_EQ(sim::dead_handle_uses(), 0u);
}

TEST_F(StreamOrderTest, PagesUnderPendingWorkAreUnmappedOnlyAfterWaiting) {
  make(sim_config(1 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(768 * MiB, s1);
  sim::hold_stream(s1);
  alloc_->deallocate(a, s1);
  auto waits = [] {
    return sim::call_count(driver::EntryPoint::event_synchronize) +
           sim::call_count(driver::EntryPoint::ctx_synchronize);
  };
  const uint64_t syncs = waits();
  // s2 needs pages that exist only under a's range: the allocator must wait for s1 first (a
  // context synchronize: s1's handle is not touched from s2's call).
  void* b = alloc_->allocate(900 * MiB, s2);
  ASSERT_NE(b, nullptr);
  EXPECT_GT(waits(), syncs);
  EXPECT_EQ(sim::pending_events(), 0u);
  fill_pattern(b, 900 * MiB, 5);
  EXPECT_EQ(check_pattern(b, 900 * MiB, 5), SIZE_MAX);
  alloc_->deallocate(b, s2);
}

TEST_F(StreamOrderTest, FreeOnAnotherStreamAlsoWaitsForTheAllocatingStream) {
  make(sim_config(4 * GiB));
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(2 * MiB, s1);
  sim::hold_stream(s1);
  alloc_->deallocate(a, s2);  // ordered on s2, but s1 may still be using it
  void* b = alloc_->allocate(2 * MiB, s2);
  EXPECT_FALSE(overlaps(a, 2 * MiB, b, 2 * MiB));
  alloc_->deallocate(b, s2);
  sim::release_stream(s1);
}

TEST_F(StreamOrderTest, CallsRunInTheDevicesContextWhateverTheThreadHasCurrent) {
  sim::SimConfig cfg = sim_config(2 * GiB, true, 2);
  alloc_.reset();
  drv_ = driver::load_sim(cfg, "test");
  alloc_ = std::make_unique<core::DeviceAllocator>(*drv_, 1, core::AllocatorOptions{});
  CUstream s1 = new_stream(1), s1b = new_stream(1);
  // Make device 0's context current on this thread.
  const auto& t = drv_->table();
  CUcontext ctx0 = nullptr;
  CUdevice dev0 = 0;
  ASSERT_EQ(t.device_get(&dev0, 0), CUDA_SUCCESS);
  ASSERT_EQ(t.device_primary_ctx_retain(&ctx0, dev0), CUDA_SUCCESS);
  ASSERT_EQ(t.ctx_set_current(ctx0), CUDA_SUCCESS);
  void* a = alloc_->allocate(4 * MiB, s1);
  alloc_->record_stream(a, s1b);
  alloc_->deallocate(a, s1);  // records an event on s1b: must happen in device 1's context
  alloc_->release_cached();   // waits on it
  CUcontext cur = nullptr;
  t.ctx_get_current(&cur);
  EXPECT_EQ(cur, ctx0) << "the caller's current context was not restored";
  t.ctx_set_current(nullptr);
  t.device_primary_ctx_release(dev0);
}

// The application destroys a stream and creates another while expanse records a fence on the
// first: the driver hands the new stream the same handle value (rapidsai/rmm#649), so the
// fence lands on the new, idle stream and completes at once, and the old stream's freed block
// looks safe while its work runs. The test wraps cuEventRecord to recycle the handle inside
// that window, deterministically. expanse closes the window by never recording on a handle
// the current call was not given (another thread may destroy it at any time): s2's allocate
// must not record on s1 at all, and must not hand out s1's block while its work is pending.
struct RecycleOnRecord {
  static inline const driver::DriverTable* real = nullptr;
  static inline CUstream target = nullptr;  // armed: recycle this handle at its next record
  static inline bool recycled = false;
  static CUresult record(CUevent e, CUstream s) {
    if (target != nullptr && s == target) {
      target = nullptr;
      CUstream fresh = nullptr;
      recycled = real->stream_destroy(s) == CUDA_SUCCESS &&
                 real->stream_create(&fresh, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
                 fresh == s;
    }
    return real->event_record(e, s);
  }
};

TEST_F(StreamOrderTest, NoFenceIsRecordedOnAHandleTheCallWasNotGiven) {
  make(sim_config(1 * GiB));
  driver::DriverTable table = drv_->table();
  RecycleOnRecord::real = &drv_->table();
  table.event_record = RecycleOnRecord::record;
  driver::LoadedDriver wrapped(table, driver::DriverKind::sim, "recycle on record", nullptr);
  core::AllocatorOptions opts;
  opts.lifo_depth = 0;  // frees go straight to the index, where a fence can make them safe
  alloc_ = std::make_unique<core::DeviceAllocator>(wrapped, 0, opts);
  CUstream s1 = new_stream(), s2 = new_stream();
  void* a = alloc_->allocate(2 * MiB, s1);
  sim::hold_stream(s1);  // s1's kernels on a still run
  {
    const auto& t = drv_->table();
    CUcontext ctx = nullptr;
    ASSERT_EQ(t.stream_get_ctx(s1, &ctx), CUDA_SUCCESS);
    ASSERT_EQ(t.ctx_push_current(ctx), CUDA_SUCCESS);
    CUevent kernel = nullptr;
    ASSERT_EQ(t.event_create(&kernel, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(t.event_record(kernel, s1), CUDA_SUCCESS);  // the work on a (the real record)
    alloc_->deallocate(a, s1);
    RecycleOnRecord::target = s1;
    void* b = alloc_->allocate(2 * MiB, s2);  // polls: must not record a fence on s1
    EXPECT_FALSE(RecycleOnRecord::recycled)
        << "s2's allocate recorded on s1, a handle another thread may have destroyed";
    EXPECT_FALSE(overlaps(a, 2 * MiB, b, 2 * MiB) && t.event_query(kernel) != CUDA_SUCCESS)
        << "handed to s2 while s1's (destroyed stream's) work on it is pending";
    alloc_->deallocate(b, s2);
    sim::release_all();
    alloc_->release_cached();
    t.event_destroy(kernel);
    CUcontext popped = nullptr;
    t.ctx_pop_current(&popped);
  }
  EXPECT_EQ(alloc_->check_invariants(), "");
  alloc_.reset();  // before `wrapped`
  RecycleOnRecord::target = nullptr;
}

// A context sync invalidates every capture in the context, whichever thread syncs and whatever
// the modes (CUDA Programming Guide, "Prohibited and Unhandled Operations"). Memory freed on a
// stream that was then destroyed with its work pending can be proven free only by one; a stream
// expanse has never seen may be capturing meanwhile, and nothing in the driver tells.
class CaptureVersusSyncTest : public StreamOrderTest {
 protected:
  // All of a 8 MiB device freed on a stream that is then destroyed, its work pending; then a
  // capture begins on a stream expanse does not know. Returns that stream.
  CUstream setup(bool announce) {
    make(sim_config(8 * MiB));
    const auto& t = drv_->table();
    CUstream s1 = new_stream();
    void* a = alloc_->allocate(8 * MiB, s1);
    sim::hold_stream(s1);
    alloc_->deallocate(a, s1);
    EXPECT_EQ(t.stream_get_ctx(s1, &ctx_), CUDA_SUCCESS);
    EXPECT_EQ(t.ctx_push_current(ctx_), CUDA_SUCCESS);
    EXPECT_EQ(t.stream_destroy(s1), CUDA_SUCCESS);
    streams_.erase(std::find(streams_.begin(), streams_.end(), s1));
    CUstream cap = new_stream();
    if (announce) core::CaptureAnnouncements::begin(ctx_);
    EXPECT_EQ(t.stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    return cap;
  }
  CUresult end(CUstream cap) {
    CUgraph g = nullptr;
    const CUresult r = drv_->table().stream_end_capture(cap, &g);
    if (g != nullptr) drv_->table().graph_destroy(g);
    return r;
  }
  void TearDown() override {
    sim::release_all();
    CUcontext popped = nullptr;
    if (ctx_ != nullptr) drv_->table().ctx_pop_current(&popped);
    StreamOrderTest::TearDown();
  }
  CUcontext ctx_ = nullptr;
};

// What any code that syncs a context does to a capture it cannot see (the driver refuses the
// sync, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture is lost); the sim says which call
// broke it.
TEST_F(CaptureVersusSyncTest, UnannouncedCaptureIsInvalidatedByTheWaitAndTheSimSaysByWhat) {
  CUstream cap = setup(/*announce=*/false);
  CUstream s2 = new_stream();
  // Only a context sync proves s1's work done; the driver refuses it.
  EXPECT_THROW(alloc_->allocate(8 * MiB, s2), out_of_memory);
  EXPECT_EQ(end(cap), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_NE(sim::capture_log().find("invalidated by cuCtxSynchronize"), std::string::npos)
      << sim::capture_log();
}

// With the capture announced, expanse does not sync the context; the memory stays unproven (the
// request fails: there is no other), the capture ends valid, and once it has ended the same request
// succeeds.
TEST_F(CaptureVersusSyncTest, AnnouncedCaptureIsNeverSyncedOver) {
  CUstream cap = setup(/*announce=*/true);
  CUstream s2 = new_stream();
  const uint64_t syncs = sim::call_count(driver::EntryPoint::ctx_synchronize);
  EXPECT_THROW(alloc_->allocate(8 * MiB, s2), out_of_memory);
  EXPECT_EQ(sim::call_count(driver::EntryPoint::ctx_synchronize), syncs);
  EXPECT_EQ(end(cap), CUDA_SUCCESS) << sim::capture_log();
  core::CaptureAnnouncements::end(ctx_);
  void* b = alloc_->allocate(8 * MiB, s2);
  EXPECT_NE(b, nullptr);
  alloc_->deallocate(b, s2);
}

}  // namespace
}  // namespace expanse::test

namespace expanse::test {
namespace {

// A dead stream handle must never reach the driver (on an H100 with driver 580,
// cuStreamIsCapturing on one returned 709, then crashed inside libcuda): after the application
// destroyed streams it had freed memory on, release_cached passes the driver no stream handle but
// the current call's, the legacy and the calling thread's per-thread stream.
TEST_F(StreamOrderTest, DestroyedStreamsAreNeverAskedAbout) {
  make(sim_config(1 * GiB));
  const auto& t = drv_->table();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ASSERT_EQ(t.device_get(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(t.device_primary_ctx_retain(&ctx, dev), CUDA_SUCCESS);
  ASSERT_EQ(t.ctx_push_current(ctx), CUDA_SUCCESS);
  CUstream s1 = nullptr, s2 = nullptr, s3 = nullptr;
  ASSERT_EQ(t.stream_create(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(t.stream_create(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* a = alloc_->allocate(300 * MiB, s1);
  void* b = alloc_->allocate(300 * MiB, s2);
  sim::hold_stream(s1);  // s1's work still runs when it is destroyed
  alloc_->deallocate(a, s1);
  alloc_->deallocate(b, s2);
  ASSERT_EQ(t.stream_destroy(s1), CUDA_SUCCESS);
  ASSERT_EQ(t.stream_destroy(s2), CUDA_SUCCESS);
  const uint64_t before = sim::dead_handle_uses();
  // A stream created after them may take a handle value back; one of the two stays dead.
  ASSERT_EQ(t.stream_create(&s3, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* c = alloc_->allocate(900 * MiB, s3);  // needs a's and b's pages: waits, never asks them
  ASSERT_NE(c, nullptr);
  alloc_->deallocate(c, s3);
  alloc_->release_cached();
  EXPECT_EQ(sim::dead_handle_uses(), before) << "a destroyed stream's handle was passed to the driver";
  EXPECT_EQ(sim::pending_events(), 0u);
  t.stream_destroy(s3);
  CUcontext popped = nullptr;
  t.ctx_pop_current(&popped);
  t.device_primary_ctx_release(dev);
}

// An application that creates streams, frees on them and destroys them (all created first, so
// no handle value comes back and nothing marks them gone) must not grow expanse's stream table
// forever: once their frees are proven done, the states beyond a few dozen are forgotten. Was a
// leak (200 states kept). A steady set of streams keeps its states (no new driver questions).
TEST_F(StreamOrderTest, StatesOfDestroyedStreamsAreForgotten) {
  make(sim_config(1 * GiB));
  const auto& t = drv_->table();
  constexpr int kStreams = 200;
  std::vector<CUstream> ss;
  for (int i = 0; i < kStreams; ++i) ss.push_back(new_stream());
  // Blocks live on every stream at once: no state can be forgotten yet.
  std::vector<void*> ps;
  for (CUstream s : ss) ps.push_back(alloc_->allocate(1 * MiB, s));
  EXPECT_GE(alloc_->stats().tracked_streams, static_cast<uint64_t>(kStreams));
  for (size_t i = 0; i < ss.size(); ++i) alloc_->deallocate(ps[i], ss[i]);
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  ASSERT_EQ(t.device_get(&dev, 0), CUDA_SUCCESS);
  ASSERT_EQ(t.device_primary_ctx_retain(&ctx, dev), CUDA_SUCCESS);
  ASSERT_EQ(t.ctx_push_current(ctx), CUDA_SUCCESS);
  for (CUstream s : ss) ASSERT_EQ(t.stream_destroy(s), CUDA_SUCCESS);
  streams_.clear();
  CUcontext popped = nullptr;
  t.ctx_pop_current(&popped);
  t.device_primary_ctx_release(dev);
  alloc_->release_cached();  // proves every free done (a context sync), then forgets
  EXPECT_LE(alloc_->stats().tracked_streams, 64u);

  // A few streams in steady use keep their states: no more stream questions per call.
  CUstream a = new_stream(), b = new_stream();
  for (int i = 0; i < 3; ++i) {
    alloc_->deallocate(alloc_->allocate(1 * MiB, a), a);
    alloc_->deallocate(alloc_->allocate(1 * MiB, b), b);
  }
  const uint64_t q0 = alloc_->stats().stream_queries;
  alloc_->deallocate(alloc_->allocate(1 * MiB, a), a);
  const uint64_t per_pair = alloc_->stats().stream_queries - q0;
  for (int i = 0; i < 50; ++i) {
    alloc_->deallocate(alloc_->allocate(1 * MiB, a), a);
    alloc_->deallocate(alloc_->allocate(1 * MiB, b), b);
  }
  EXPECT_EQ(alloc_->stats().stream_queries - q0, per_pair * 101);
  EXPECT_EQ(alloc_->check_invariants(), "");
}

// A forgotten state made again must not restart its free numbers at 0: a pending block waiting for
// (legacy stream, n) would wait forever and the memory be lost to out-of-memory. Free numbers come
// from one allocator-wide clock and a state made again starts at "proven up to now". 140 streams
// keep a live block each, so states are forgotten.
TEST_F(StreamOrderTest, ForgottenStateMadeAgainStrandsNothing) {
  make(sim_config(1 * GiB));
  CUstream a = new_stream(), l = new_stream(), b = new_stream();
  std::vector<std::pair<void*, CUstream>> keep;
  for (int i = 0; i < 140; ++i) {
    CUstream f = new_stream();
    keep.emplace_back(alloc_->allocate(512, f), f);
  }
  void* x = alloc_->allocate(512 * MiB, a);
  alloc_->record_stream(x, nullptr);  // the legacy stream's state
  alloc_->record_stream(x, l);
  sim::hold_stream(l);
  alloc_->deallocate(x, a);                  // pending on the legacy stream and on l
  void* a2 = alloc_->allocate(3 * MiB, a);   // polls: the legacy fence passes, l's does not
  void* y = alloc_->allocate(1 * MiB, b);
  alloc_->record_stream(y, nullptr);         // the legacy stream named again
  sim::release_stream(l);
  alloc_->deallocate(alloc_->allocate(5 * MiB, l), l);  // l fenced
  alloc_->release_cached();
  EXPECT_EQ(alloc_->describe_stream_order(x).find("pending "), std::string::npos)
      << alloc_->describe_stream_order(x);
  void* big = alloc_->allocate(600 * MiB, b);  // needs x's pages
  EXPECT_NE(big, nullptr);
  alloc_->deallocate(big, b);
  alloc_->deallocate(a2, a);
  alloc_->deallocate(y, b);
  for (auto& [p, f] : keep) alloc_->deallocate(p, f);
  EXPECT_EQ(alloc_->check_invariants(), "");
}

// A sync of one context holds up an announcement in that context (a capture begun during it
// would be invalidated) and nothing else: one process-wide lock held across cuCtxSynchronize
// would block every context's announcements and other devices' fences.
TEST(CaptureAnnouncementsThreadTest, ASyncHoldsUpOnlyItsOwnContextsAnnouncements) {
  auto* c1 = reinterpret_cast<CUcontext>(uintptr_t{0x1001});
  auto* c2 = reinterpret_cast<CUcontext>(uintptr_t{0x1002});
  std::promise<void> syncing, release;
  std::shared_future<void> released = release.get_future().share();
  std::thread sync([&] {
    core::CaptureAnnouncements::run_unless_capturing(c1, [&] {
      syncing.set_value();
      released.wait();
      return true;
    });
  });
  syncing.get_future().wait();
  std::atomic<bool> began1{false};
  std::thread announce1([&] {
    core::CaptureAnnouncements::begin(c1, nullptr);
    began1 = true;
  });
  core::CaptureAnnouncements::begin(c2, nullptr);  // another context: at once
  EXPECT_EQ(core::CaptureAnnouncements::count(c2), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(began1.load()) << "a capture was announced while its context was being synced";
  release.set_value();
  sync.join();
  announce1.join();
  EXPECT_TRUE(began1.load());
  EXPECT_EQ(core::CaptureAnnouncements::count(c1), 1);
  // Announced: no sync of c1 runs; ended by stream (no driver call needed), it runs again.
  bool ran = false;
  EXPECT_FALSE(core::CaptureAnnouncements::run_unless_capturing(c1, [&] { return ran = true; }));
  EXPECT_FALSE(ran);
  core::CaptureAnnouncements::end(c1);
  core::CaptureAnnouncements::end(c2);
  int stream_tag = 0;
  core::CaptureAnnouncements::begin(c1, &stream_tag);
  EXPECT_TRUE(core::CaptureAnnouncements::end_stream(&stream_tag));
  EXPECT_FALSE(core::CaptureAnnouncements::end_stream(&stream_tag));
  EXPECT_TRUE(core::CaptureAnnouncements::run_unless_capturing(c1, [&] { return ran = true; }));
  EXPECT_TRUE(ran);
  EXPECT_EQ(core::CaptureAnnouncements::count(c1), 0);
  EXPECT_EQ(core::CaptureAnnouncements::count(c2), 0);
}

}  // namespace
}  // namespace expanse::test
