// Pools through the C ABI (expanse_pool_*): errors, routing by thread, filter and capture,
// nesting, a default-pool block joining a capture's pool when freed in the capture, stats, and
// the graph hazard pools exist for. Each case runs on the in-process sim (driver:sim) and on
// libexpanse_simcuda.so loaded as the CUDA driver (driver:cuda,driver_library:...), where the
// test's streams, events and captures come from the same library.
#include "two_drivers_fixture.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <mutex>
#include <condition_variable>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;

using expanse::test::overlaps;

CUstream_st* cs(CUstream s) { return reinterpret_cast<CUstream_st*>(s); }

expanse_pool_stats stats_of(expanse_pool_id id) {
  expanse_pool_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(expanse_pool_get_stats(id, &s), EXPANSE_OK) << expanse_last_error();
  return s;
}

bool same(const expanse_pool_stats& a, const expanse_pool_stats& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

class Pools : public expanse::test::TwoDrivers {
 protected:
  void TearDown() override {
    if (started_) {
      release_all_();
      for (auto& [dev, e] : events_) {
        push(dev);
        t().event_destroy(e);
        pop();
      }
    }
    TwoDrivers::TearDown();
  }

  CUevent event(int dev = 0) {
    push(dev);
    CUevent e = nullptr;
    EXPECT_EQ(t().event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    pop();
    events_.emplace_back(dev, e);
    return e;
  }
  // `to` waits for `from`'s work so far (in a capture: forks `to` into it, or joins it back).
  void wait_for(CUstream to, CUstream from) {
    CUevent e = event();
    ASSERT_EQ(t().event_record(e, from), CUDA_SUCCESS);
    ASSERT_EQ(t().stream_wait_event(to, e, 0), CUDA_SUCCESS);
  }
  expanse_pool_id create(int dev = 0) {
    expanse_pool_id id = 0;
    EXPECT_EQ(expanse_pool_create(dev, &id), EXPANSE_OK) << expanse_last_error();
    EXPECT_NE(id, 0u);
    return id;
  }

  std::vector<std::pair<int, CUevent>> events_;
};

void* must_malloc(size_t n, int dev, CUstream s) {
  void* p = expanse_malloc(n, dev, cs(s));
  EXPECT_NE(p, nullptr) << expanse_last_error();
  return p;
}
void must_free(void* p, size_t n, int dev, CUstream s) {
  EXPECT_EQ(expanse_free_checked(p, n, dev, cs(s)), EXPANSE_OK) << expanse_last_error();
}

// An error with code `rc` whose message names pool `id` (and `also`, when given).
#define EXPECT_POOL_ERROR(call, rc, id, also)                                           \
  do {                                                                                  \
    EXPECT_EQ((call), (rc)) << #call;                                                   \
    const std::string m_ = expanse_last_error();                                        \
    EXPECT_NE(m_.find("pool " + std::to_string(id)), std::string::npos) << #call << ": " << m_; \
    EXPECT_NE(m_.find(also), std::string::npos) << #call << ": " << m_;                  \
  } while (0)

TEST_P(Pools, ErrorsNameTheIdAndChangeNothing) {
  start("sim_capacity:1GiB");
  const expanse_pool_id unknown = 987654321;
  EXPECT_POOL_ERROR(expanse_pool_retain(unknown), EXPANSE_EINVAL, unknown, "does not exist");
  EXPECT_POOL_ERROR(expanse_pool_release(unknown), EXPANSE_EINVAL, unknown, "does not exist");
  EXPECT_POOL_ERROR(expanse_pool_begin_thread(unknown), EXPANSE_EINVAL, unknown, "");
  EXPECT_POOL_ERROR(expanse_pool_end(unknown), EXPANSE_EINVAL, unknown, "");
  EXPECT_POOL_ERROR(expanse_pool_trim(unknown), EXPANSE_EINVAL, unknown, "");
  EXPECT_EQ(expanse_pool_malloc(unknown, MiB, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("pool 987654321"), std::string::npos);
  expanse_pool_stats s{};
  s.struct_size = sizeof s;
  EXPECT_POOL_ERROR(expanse_pool_get_stats(unknown, &s), EXPANSE_EINVAL, unknown, "");
  EXPECT_EQ(expanse_pool_create(0, nullptr), EXPANSE_EINVAL);

  const expanse_pool_id p = create();
  void* a = expanse_pool_malloc(p, 3 * MiB, nullptr);
  ASSERT_NE(a, nullptr) << expanse_last_error();
  const expanse_pool_stats before = stats_of(p);
  // A double end, and an end with no begin.
  EXPECT_POOL_ERROR(expanse_pool_end(p), EXPANSE_EINVAL, p, "routes nothing");
  ASSERT_EQ(expanse_pool_begin_thread(p), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK) << expanse_last_error();
  EXPECT_POOL_ERROR(expanse_pool_end(p), EXPANSE_EINVAL, p, "routes nothing");
  EXPECT_POOL_ERROR(expanse_pool_trim(p), EXPANSE_EINVAL, p, "in use");
  EXPECT_POOL_ERROR(expanse_pool_begin_filter(p, nullptr, nullptr), EXPANSE_EINVAL, p, "NULL");
  EXPECT_TRUE(same(before, stats_of(p)));

  // Released: no retain, release or begin.
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK) << expanse_last_error();
  const expanse_pool_stats released = stats_of(p);
  EXPECT_EQ(released.use_count, 0);
  EXPECT_EQ(released.released, 1u);
  EXPECT_POOL_ERROR(expanse_pool_retain(p), EXPANSE_EINVAL, p, "released");
  EXPECT_POOL_ERROR(expanse_pool_release(p), EXPANSE_EINVAL, p, "released");
  EXPECT_POOL_ERROR(expanse_pool_begin_thread(p), EXPANSE_EINVAL, p, "released");
  auto accept_all = [](CUstream_st*, void*) { return 1; };
  EXPECT_POOL_ERROR(expanse_pool_begin_filter(p, accept_all, nullptr), EXPANSE_EINVAL, p,
                    "released");
  CUstream s1 = stream();
  EXPECT_POOL_ERROR(expanse_pool_begin_capture(p, cs(s1)), EXPANSE_EINVAL, p, "released");
  EXPECT_EQ(expanse_pool_malloc(p, MiB, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("pool " + std::to_string(p)),
            std::string::npos)
      << expanse_last_error();
  EXPECT_TRUE(same(released, stats_of(p)));
  // A failed begin left no route and no announcement behind.
  void* d = must_malloc(MiB, 0, nullptr);
  EXPECT_TRUE(same(released, stats_of(p)));
  must_free(d, MiB, 0, nullptr);
  must_free(a, 3 * MiB, 0, nullptr);
}

TEST_P(Pools, PoolMallocOnAnotherDevicesStreamIsRefused) {
  start("sim_devices:2,sim_capacity:1GiB");
  const expanse_pool_id p = create(0);
  CUstream s1 = stream(1);
  const expanse_pool_stats before = stats_of(p);
  expanse_stats dev0{}, dev0_after{};
  dev0.struct_size = dev0_after.struct_size = sizeof dev0;
  ASSERT_EQ(expanse_get_stats(0, &dev0), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_malloc(p, 4 * MiB, cs(s1)), nullptr);
  const std::string m = expanse_last_error();
  char stream_text[32];
  std::snprintf(stream_text, sizeof stream_text, "%p", static_cast<void*>(s1));
  EXPECT_NE(m.find("pool " + std::to_string(p)), std::string::npos) << m;
  EXPECT_NE(m.find(stream_text), std::string::npos) << m;
  EXPECT_NE(m.find("device 0"), std::string::npos) << m;
  EXPECT_NE(m.find("device 1"), std::string::npos) << m;
  EXPECT_POOL_ERROR(expanse_pool_begin_capture(p, cs(s1)), EXPANSE_EINVAL, p, "device 1");
  EXPECT_TRUE(same(before, stats_of(p)));
  ASSERT_EQ(expanse_get_stats(0, &dev0_after), EXPANSE_OK);
  EXPECT_EQ(dev0_after.num_allocs, dev0.num_allocs);
  // Its own device's stream is fine; so is a pool on device 1 with s1.
  CUstream s0 = stream(0);
  void* a = expanse_pool_malloc(p, 4 * MiB, cs(s0));
  ASSERT_NE(a, nullptr) << expanse_last_error();
  const expanse_pool_id q = create(1);
  void* b = expanse_pool_malloc(q, 4 * MiB, cs(s1));
  ASSERT_NE(b, nullptr) << expanse_last_error();
  EXPECT_EQ(stats_of(q).device, 1);
  must_free(a, 4 * MiB, 0, s0);
  must_free(b, 4 * MiB, 1, s1);
}

TEST_P(Pools, StatsFields) {
  start("sim_capacity:1GiB");
  const expanse_pool_id p = create();
  expanse_pool_stats s = stats_of(p);
  EXPECT_EQ(s.struct_size, sizeof(expanse_pool_stats));
  EXPECT_EQ(s.id, p);
  EXPECT_EQ(s.device, 0);
  EXPECT_EQ(s.use_count, 1);
  EXPECT_EQ(s.released, 0u);
  EXPECT_EQ(s.returned, 0u);
  EXPECT_EQ(s.live_blocks, 0u);
  void* a = expanse_pool_malloc(p, 3 * MiB + 1, nullptr);
  void* b = expanse_pool_malloc(p, 1000, nullptr);
  ASSERT_TRUE(a != nullptr && b != nullptr) << expanse_last_error();
  s = stats_of(p);
  EXPECT_EQ(s.live_blocks, 2u);
  EXPECT_EQ(s.requested_bytes, 3 * MiB + 1 + 1000);
  EXPECT_EQ(s.live_bytes, 3 * MiB + 512 + 1024);
  // A pool takes whole pages (2 MiB on the sim): what its blocks leave of them is its cached
  // memory. a's pages in the large arena, b's page in the small one.
  EXPECT_EQ(s.cached_bytes, (4 * MiB - (3 * MiB + 512)) + (2 * MiB - 1024));
  EXPECT_EQ(s.physical_bytes, 6 * MiB);
  must_free(a, 3 * MiB + 1, 0, nullptr);
  s = stats_of(p);
  EXPECT_EQ(s.live_blocks, 1u);
  EXPECT_EQ(s.cached_bytes, 6 * MiB - 1024);
  ASSERT_EQ(expanse_pool_retain(p), EXPANSE_OK);
  EXPECT_EQ(stats_of(p).use_count, 2);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
  // Only the caller's struct_size is written.
  expanse_pool_stats part;
  std::memset(&part, 0xab, sizeof part);
  part.struct_size = offsetof(expanse_pool_stats, use_count);
  ASSERT_EQ(expanse_pool_get_stats(p, &part), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(part.struct_size, offsetof(expanse_pool_stats, use_count));
  EXPECT_EQ(part.id, p);
  EXPECT_EQ(part.device, 0);
  EXPECT_EQ(part.use_count, static_cast<int32_t>(0xabababab));
  part.struct_size = 4;
  EXPECT_EQ(expanse_pool_get_stats(p, &part), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_pool_get_stats(p, nullptr), EXPANSE_EINVAL);
  must_free(b, 1000, 0, nullptr);
}

TEST_P(Pools, ThreadRoutingIsTheCallingThreadsOnItsDeviceOnly) {
  start("sim_devices:2,sim_capacity:1GiB");
  const expanse_pool_id p = create(0);
  ASSERT_EQ(expanse_pool_begin_thread(p), EXPANSE_OK) << expanse_last_error();
  void* mine = must_malloc(2 * MiB, 0, nullptr);
  void* checked = nullptr;
  ASSERT_EQ(expanse_malloc_checked(&checked, MiB, 0, nullptr), EXPANSE_OK);
  void* other_device = must_malloc(2 * MiB, 1, nullptr);
  void* theirs = nullptr;
  std::thread([&] { theirs = expanse_malloc(2 * MiB, 0, nullptr); }).join();
  ASSERT_NE(theirs, nullptr);
  EXPECT_EQ(stats_of(p).live_blocks, 2u) << "the thread's two device-0 allocations only";
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK) << expanse_last_error();
  void* after = must_malloc(2 * MiB, 0, nullptr);
  EXPECT_EQ(stats_of(p).live_blocks, 2u);
  for (void* x : {mine, checked, theirs, after}) must_free(x, 0, 0, nullptr);
  must_free(other_device, 0, 1, nullptr);
  EXPECT_EQ(stats_of(p).live_blocks, 0u);
  EXPECT_EQ(stats_of(p).cached_bytes, 4 * MiB)
      << "pool blocks go back to their pool (which takes whole pages: 3 MiB in 2 MiB pages)";
}

struct FilterCtx {
  CUstream accept = nullptr;
  int calls = 0;
};

int accept_one(CUstream_st* s, void* ctx) {
  auto* f = static_cast<FilterCtx*>(ctx);
  ++f->calls;
  return reinterpret_cast<CUstream>(s) == f->accept ? 1 : 0;
}

TEST_P(Pools, FilterRoutingAsksTheFilter) {
  start("sim_capacity:1GiB");
  CUstream s1 = stream(), s2 = stream();
  const expanse_pool_id p = create();
  FilterCtx f{s1, 0};
  ASSERT_EQ(expanse_pool_begin_filter(p, accept_one, &f), EXPANSE_OK) << expanse_last_error();
  void* a = must_malloc(MiB, 0, s1);
  void* b = must_malloc(MiB, 0, s2);
  EXPECT_EQ(f.calls, 2);
  EXPECT_EQ(stats_of(p).live_blocks, 1u);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK);
  void* c = must_malloc(MiB, 0, s1);
  EXPECT_EQ(f.calls, 2) << "an ended route is not asked";
  EXPECT_EQ(stats_of(p).live_blocks, 1u);
  must_free(a, MiB, 0, s1);
  must_free(b, MiB, 0, s2);
  must_free(c, MiB, 0, s1);
}

expanse_pool_id pool_of(const void* p) {
  expanse_pool_id id = 12345;
  EXPECT_EQ(expanse_pool_of(p, &id), EXPANSE_OK) << expanse_last_error();
  return id;
}

// expanse_pool_of: the pool of a live block however it got there (routed by thread or filter,
// expanse_pool_malloc, the torch entry point), 0 for the default pool, an error for anything
// not live; a pool's block stays its pool's after the release; a freed address reused by the
// default pool is the default pool's.
TEST_P(Pools, PoolOfNamesTheLiveBlocksPool) {
  start("sim_devices:2,sim_capacity:1GiB");
  CUstream s1 = stream();
  const expanse_pool_id p = create(0), q = create(0), r = create(1);
  void* plain = must_malloc(MiB, 0, nullptr);
  EXPECT_EQ(pool_of(plain), 0u);
  ASSERT_EQ(expanse_pool_begin_thread(p), EXPANSE_OK);
  void* in_p = must_malloc(MiB, 0, nullptr);
  void* torch_in_p = expanse_torch_malloc(4096, 0, nullptr);
  void* on_1 = must_malloc(MiB, 1, nullptr);  // the route is device 0's only
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK);
  FilterCtx f{s1, 0};
  ASSERT_EQ(expanse_pool_begin_filter(q, accept_one, &f), EXPANSE_OK);
  void* in_q = must_malloc(MiB, 0, s1);
  ASSERT_EQ(expanse_pool_end(q), EXPANSE_OK);
  void* in_r = expanse_pool_malloc(r, MiB, nullptr);
  ASSERT_NE(in_r, nullptr) << expanse_last_error();
  EXPECT_EQ(pool_of(in_p), p);
  EXPECT_EQ(pool_of(torch_in_p), p);
  EXPECT_EQ(pool_of(on_1), 0u);
  EXPECT_EQ(pool_of(in_q), q);
  EXPECT_EQ(pool_of(in_r), r);

  expanse_pool_id id = 7;
  EXPECT_EQ(expanse_pool_of(static_cast<char*>(in_p) + 512, &id), EXPANSE_EINVAL);
  EXPECT_EQ(id, 0u);
  EXPECT_NE(std::string(expanse_last_error()).find("not the start of a live block"),
            std::string::npos) << expanse_last_error();
  EXPECT_EQ(expanse_pool_of(nullptr, &id), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_pool_of(in_p, nullptr), EXPANSE_EINVAL);

  // A free that fails (wrong size) leaves the block its pool's.
  EXPECT_EQ(expanse_free_checked(in_q, 3 * MiB, 0, cs(s1)), EXPANSE_EINVAL);
  EXPECT_EQ(pool_of(in_q), q);

  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
  EXPECT_EQ(pool_of(in_p), p) << "a live block stays its pool's after the release";
  must_free(in_p, MiB, 0, nullptr);
  expanse_torch_free(torch_in_p, 4096, 0, nullptr);
  EXPECT_EQ(expanse_pool_of(in_p, &id), EXPANSE_EINVAL) << "freed: not live";
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK);  // p's memory returns to the default pool
  std::vector<void*> again;
  bool reused = false;
  for (int i = 0; i < 8 && !reused; ++i) {
    again.push_back(must_malloc(MiB, 0, nullptr));
    EXPECT_EQ(pool_of(again.back()), 0u);
    reused = again.back() == in_p;
  }
  for (void* x : again) must_free(x, MiB, 0, nullptr);
  for (void* x : {plain, in_q}) must_free(x, MiB, 0, x == in_q ? s1 : nullptr);
  must_free(on_1, MiB, 1, nullptr);
  must_free(in_r, MiB, 1, nullptr);
}

TEST_P(Pools, RoutesNestNewestFirst) {
  start("sim_capacity:1GiB");
  const expanse_pool_id a = create(), b = create();
  auto live = [&](expanse_pool_id id) { return stats_of(id).live_blocks; };
  std::vector<void*> blocks;
  ASSERT_EQ(expanse_pool_begin_thread(a), EXPANSE_OK);
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(a), 1u);
  ASSERT_EQ(expanse_pool_begin_thread(b), EXPANSE_OK);
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(b), 1u) << "the newest route wins";
  ASSERT_EQ(expanse_pool_begin_thread(a), EXPANSE_OK);  // a again, newest
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(a), 2u);
  ASSERT_EQ(expanse_pool_end(a), EXPANSE_OK);  // a's newest: b routes again
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(b), 2u);
  ASSERT_EQ(expanse_pool_end(a), EXPANSE_OK);  // a's older one, beneath b's
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(b), 3u);
  ASSERT_EQ(expanse_pool_end(b), EXPANSE_OK);
  blocks.push_back(must_malloc(MiB, 0, nullptr));
  EXPECT_EQ(live(a) + live(b), 5u) << "no route: the default pool";
  EXPECT_POOL_ERROR(expanse_pool_end(a), EXPANSE_EINVAL, a, "routes nothing");
  for (void* x : blocks) must_free(x, MiB, 0, nullptr);
}

// A capture route takes every allocation made on a stream of its capture, a side stream forked
// into the capture included, and none made elsewhere.
TEST_P(Pools, CaptureRoutingTakesSideStreamsOfTheCapture) {
  start("sim_capacity:1GiB");
  CUstream cap = stream(), side = stream(), other = stream();
  const expanse_pool_id p = create();
  push(0);
  ASSERT_EQ(expanse_pool_begin_capture(p, cs(cap)), EXPANSE_OK) << expanse_last_error();
  void* before = must_malloc(MiB, 0, cap);  // not capturing yet: the default pool
  EXPECT_EQ(stats_of(p).live_blocks, 0u);
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  wait_for(side, cap);  // fork
  void* x = must_malloc(2 * MiB, 0, side);
  EXPECT_EQ(stats_of(p).live_blocks, 1u) << "the side stream's allocation";
  void* y = must_malloc(2 * MiB, 0, cap);
  EXPECT_EQ(stats_of(p).live_blocks, 2u);
  void* z = must_malloc(2 * MiB, 0, other);
  EXPECT_EQ(stats_of(p).live_blocks, 2u) << "a stream outside the capture";
  void* w = expanse_pool_malloc(p, MiB, cs(side));
  ASSERT_NE(w, nullptr) << expanse_last_error();
  wait_for(cap, side);  // join
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK) << expanse_last_error();
  void* after = must_malloc(MiB, 0, side);
  EXPECT_EQ(stats_of(p).live_blocks, 3u);
  pop();
  must_free(before, MiB, 0, cap);
  must_free(x, 2 * MiB, 0, side);
  must_free(y, 2 * MiB, 0, cap);
  must_free(z, 2 * MiB, 0, other);
  must_free(w, MiB, 0, side);
  must_free(after, MiB, 0, side);
}

// A default-pool block freed on a stream of the capture joins the capture's pool: the graph
// uses it on every replay, so no eager allocation may get it.
TEST_P(Pools, DefaultBlockFreedInTheCaptureJoinsItsPool) {
  start("sim_capacity:1GiB");
  CUstream cap = stream(), other = stream();
  const expanse_pool_id p = create();
  void* input = must_malloc(8 * MiB, 0, cap);  // the default pool's, made before the capture
  push(0);
  ASSERT_EQ(expanse_pool_begin_capture(p, cs(cap)), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  must_free(input, 8 * MiB, 0, cap);
  EXPECT_EQ(stats_of(p).cached_bytes, 8 * MiB) << "the freed block did not join the pool";
  void* in_pool = must_malloc(8 * MiB, 0, cap);
  EXPECT_EQ(stats_of(p).live_blocks, 1u);
  must_free(in_pool, 8 * MiB, 0, cap);
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK);
  pop();
  release_all_();
  std::vector<void*> eager;
  for (int i = 0; i < 4; ++i) {
    eager.push_back(must_malloc(8 * MiB, 0, other));
    EXPECT_FALSE(overlaps(input, 8 * MiB, eager.back(), 8 * MiB)) << "an eager allocation got it";
    eager.push_back(must_malloc(8 * MiB, 0, cap));
    EXPECT_FALSE(overlaps(input, 8 * MiB, eager.back(), 8 * MiB)) << "an eager allocation got it";
  }
  for (void* e : eager) must_free(e, 8 * MiB, 0, other);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
}

// THE graph hazard: memory a captured graph uses (allocated and freed inside the capture) must
// not go to eager allocations after the capture, or each replay writes over them. Without a
// pool it does (the control); with one it does not, until the pool is released and its work
// proven done.
TEST_P(Pools, GraphMemoryIsNotGivenToEagerAllocations) {
  start("sim_capacity:1GiB");
  CUstream cap = stream(), eager_stream = stream();
  constexpr size_t kSize = 32 * MiB;
  // Captures a graph that allocates two blocks on cap: a temporary freed inside the capture,
  // and an output freed after it (the graph still writes it on every replay). Returns both.
  auto capture = [&](expanse_pool_id pool) -> std::pair<void*, void*> {
    push(0);
    if (pool != 0) {
      EXPECT_EQ(expanse_pool_begin_capture(pool, cs(cap)), EXPANSE_OK) << expanse_last_error();
    } else {
      EXPECT_EQ(expanse_capture_begin(cs(cap)), EXPANSE_OK) << expanse_last_error();
    }
    EXPECT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    void* tmp = must_malloc(kSize, 0, cap);
    void* out = must_malloc(kSize, 0, cap);
    must_free(tmp, kSize, 0, cap);
    CUgraph g = nullptr;
    EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
    if (g != nullptr) t().graph_destroy(g);
    if (pool != 0) {
      EXPECT_EQ(expanse_pool_end(pool), EXPANSE_OK) << expanse_last_error();
    } else {
      EXPECT_EQ(expanse_capture_end(cs(cap)), EXPANSE_OK) << expanse_last_error();
    }
    pop();
    must_free(out, kSize, 0, cap);
    return {tmp, out};
  };
  // Eager allocations on both streams after the capture, once its work is done and proven done
  // (expanse_release_cached synchronizes the context): do any overlap the graph's memory?
  auto eager_overlaps = [&](std::pair<void*, void*> graph_mem) {
    release_all_();
    EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
    bool any = false;
    std::vector<std::pair<void*, CUstream>> got;
    for (CUstream s : {cap, eager_stream, cap, eager_stream}) {
      void* e = must_malloc(kSize, 0, s);
      any = any || overlaps(graph_mem.first, kSize, e, kSize) ||
            overlaps(graph_mem.second, kSize, e, kSize);
      got.emplace_back(e, s);
    }
    for (auto& [e, s] : got) must_free(e, kSize, 0, s);
    return any;
  };

  // A live block before the captures keeps their memory's VA reservation (cuMemAddressReserve
  // may hand out new addresses for a reservation given back).
  void* anchor = must_malloc(2 * MiB, 0, eager_stream);

  // Control: no pool. The graph's memory goes to the next eager allocation.
  const auto unpooled = capture(0);
  EXPECT_TRUE(eager_overlaps(unpooled))
      << "without a pool the graph's memory was not reused: this test no longer shows the hazard";
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK);

  // With a pool: none of the graph's bytes go to eager allocations, even after release_cached.
  const expanse_pool_id p = create();
  const auto pooled = capture(p);
  EXPECT_FALSE(eager_overlaps(pooled)) << "an eager allocation got the graph's memory";
  expanse_pool_stats s = stats_of(p);
  EXPECT_EQ(s.cached_bytes, 2 * kSize);
  EXPECT_EQ(s.physical_bytes, 2 * kSize) << "a live pool's free memory stays mapped";
  EXPECT_EQ(s.returned, 0u);
  EXPECT_FALSE(eager_overlaps(pooled));

  // Released, and proven done by release_cached's sync: the memory serves others again.
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  s = stats_of(p);
  EXPECT_EQ(s.released, 1u);
  EXPECT_EQ(s.returned, 1u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_TRUE(eager_overlaps(pooled)) << "the returned pool's range serves no one";
  // Nearly every page of the device: the pool's former pages among them.
  void* big = must_malloc(1024 * MiB - 8 * MiB, 0, eager_stream);
  ASSERT_NE(big, nullptr);
  must_free(big, 1024 * MiB - 8 * MiB, 0, eager_stream);
  must_free(anchor, 2 * MiB, 0, eager_stream);
}

// The same hazard with thread caches in front (on by default): a block parked before the capture
// is not handed to it, and none of the graph's pool's memory (the capture's blocks, a block of the
// pool taken and freed on the capture's stream) is parked and handed to the eager allocations
// that follow on that stream, with no release_cached in between to flush.
TEST_P(Pools, ThreadCachesNeverHandOutGraphMemory) {
  start("sim_capacity:1GiB,thread_cache:256MiB,thread_cache_entries:64");
  CUstream cap = stream();
  constexpr size_t kSize = 8 * MiB;
  push(0);
  void* before = must_malloc(kSize, 0, cap);
  must_free(before, kSize, 0, cap);  // parked in this thread's cache
  void* again = must_malloc(kSize, 0, cap);
  EXPECT_EQ(again, before) << "the cache does not serve: this test would show nothing";
  must_free(again, kSize, 0, cap);

  const expanse_pool_id p = create();
  ASSERT_EQ(expanse_pool_begin_capture(p, cs(cap)), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* tmp = must_malloc(kSize, 0, cap);
  void* out = must_malloc(kSize, 0, cap);
  EXPECT_FALSE(overlaps(tmp, kSize, before, kSize) || overlaps(out, kSize, before, kSize))
      << "the capture got a block parked before it";
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(out, &of), EXPANSE_OK);
  EXPECT_EQ(of, p);
  must_free(tmp, kSize, 0, cap);  // in the capture: the pool's (the graph reuses it)
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK) << expanse_last_error();
  must_free(out, kSize, 0, cap);  // after the capture: still the pool's (replays write it)
  // The pool's memory taken eagerly on the capture's stream (as a warm-up does), freed there:
  // the pool's still (its next capture may place a graph's block there), never a cache's.
  void* eager_pool = expanse_pool_malloc(p, kSize, cs(cap));
  ASSERT_NE(eager_pool, nullptr) << expanse_last_error();
  must_free(eager_pool, kSize, 0, cap);

  // Eager allocations of the graph's size on its stream, straight after: from the cache where it
  // has a block, never the graph's.
  std::vector<void*> eager;
  bool from_cache = false;
  for (int i = 0; i < 6; ++i) {
    void* e = must_malloc(kSize, 0, cap);
    from_cache = from_cache || e == before;
    EXPECT_FALSE(overlaps(e, kSize, tmp, kSize) || overlaps(e, kSize, out, kSize) ||
                 overlaps(e, kSize, eager_pool, kSize))
        << "eager allocation " << i << " got the graph's pool's memory";
    eager.push_back(e);
    if (i % 2 == 1) {  // freed and taken again: what a cache serves
      must_free(eager.back(), kSize, 0, cap);
      eager.pop_back();
    }
  }
  EXPECT_TRUE(from_cache) << "the block parked before the capture was not served after it";
  for (void* e : eager) must_free(e, kSize, 0, cap);
  pop();
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
}

// Allocating into a pool during its capture, from the capturing thread and from another thread
// allocating meanwhile (with frees still pending that the allocator wants to fence), makes no
// call the capture forbids: the capture ends valid.
TEST_P(Pools, CaptureIntoAPoolMakesNoProhibitedCall) {
  start("sim_capacity:1GiB");
  CUstream busy = stream(), cap = stream(), side = stream(), other = stream();
  void* old = must_malloc(16 * MiB, 0, busy);
  hold_(busy);
  must_free(old, 16 * MiB, 0, busy);  // pending work: fences to record and query
  const expanse_pool_id p = create();
  push(0);
  ASSERT_EQ(expanse_pool_begin_capture(p, cs(cap)), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  wait_for(side, cap);
  std::vector<std::pair<void*, size_t>> in_capture;
  std::vector<void*> outside;
  std::thread other_thread([&] {
    for (int i = 0; i < 8; ++i) {
      void* o = expanse_malloc((size_t{1} + static_cast<size_t>(i)) * 3 * MiB, 0, cs(other));
      EXPECT_NE(o, nullptr) << expanse_last_error();
      outside.push_back(o);
      if (i % 2 == 1) {
        expanse_free(outside.front(), 0, 0, cs(other));
        outside.erase(outside.begin());
      }
    }
    EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  });
  for (int i = 0; i < 8; ++i) {
    const size_t n = (size_t{1} + static_cast<size_t>(i)) * 5 * MiB + 4096;
    void* a = must_malloc(n, 0, i % 2 == 0 ? cap : side);
    in_capture.emplace_back(a, n);
    if (i % 3 == 2) {
      must_free(in_capture.front().first, in_capture.front().second, 0, cap);
      in_capture.erase(in_capture.begin());
    }
  }
  other_thread.join();
  wait_for(cap, side);
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS)
      << "the capture was invalidated: " << (dlopened() ? "" : expanse::sim::capture_log());
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK);
  pop();
  EXPECT_EQ(stats_of(p).live_blocks, in_capture.size());
  for (auto& [a, n] : in_capture) must_free(a, n, 0, cap);
  for (void* o : outside) must_free(o, 0, 0, other);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
}

// Sleep and wake through the C ABI: a weights pool offloaded, a KV-cache pool discarded. The
// driver's free memory grows by both pools' pages; pointers keep their values; every weight byte
// comes back; the wake hook runs; sleeping is refused while a capture is routed into the pool.
TEST_P(Pools, SleepGivesThePagesToTheDriverAndWakeBringsTheWeightsBack) {
  start("sim_capacity:256MiB");
  const expanse_pool_id weights = create();
  const expanse_pool_id kv = create();
  void* w = expanse_pool_malloc(weights, 40 * MiB + 300, nullptr);
  void* k = expanse_pool_malloc(kv, 64 * MiB, nullptr);
  void* other = must_malloc(8 * MiB, 0, nullptr);  // the default pool's: stays
  ASSERT_TRUE(w != nullptr && k != nullptr) << expanse_last_error();
  std::vector<unsigned char> want(40 * MiB + 300);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<unsigned char>(i * 131 + 7);
  std::memcpy(w, want.data(), want.size());
  auto driver_free = [&] {
    push(0);
    size_t f = 0, total = 0;
    EXPECT_EQ(t().mem_get_info(&f, &total), CUDA_SUCCESS);
    pop();
    return f;
  };
  const size_t free_before = driver_free();
  const size_t held = stats_of(weights).physical_bytes + stats_of(kv).physical_bytes;
  ASSERT_EQ(expanse_pool_sleep(weights, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK)
      << expanse_last_error();
  ASSERT_EQ(expanse_pool_sleep(kv, EXPANSE_SLEEP_DISCARD, nullptr), EXPANSE_OK)
      << expanse_last_error();
  EXPECT_EQ(driver_free(), free_before + held);
  EXPECT_EQ(expanse_pool_is_asleep(weights), 1);
  EXPECT_EQ(expanse_pool_is_asleep(kv), 1);
  EXPECT_EQ(stats_of(weights).physical_bytes, 0u);
  EXPECT_GE(stats_of(weights).host_backup_bytes, want.size());
  EXPECT_EQ(stats_of(kv).host_backup_bytes, 0u);
  EXPECT_POOL_ERROR(expanse_pool_sleep(weights, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_EINVAL,
                    weights, "asleep already");
  EXPECT_EQ(expanse_pool_malloc(weights, MiB, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("asleep"), std::string::npos);

  static std::vector<expanse_pool_id> woken;
  woken.clear();
  ASSERT_EQ(expanse_set_wake_hook([](expanse_pool_id id, void*) { woken.push_back(id); }, nullptr),
            EXPANSE_OK);
  ASSERT_EQ(expanse_pool_wake(weights, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_pool_wake(kv, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(woken, (std::vector<expanse_pool_id>{weights, kv}));
  ASSERT_EQ(expanse_set_wake_hook(nullptr, nullptr), EXPANSE_OK);
  EXPECT_EQ(std::memcmp(w, want.data(), want.size()), 0) << "the weights came back";
  std::memset(k, 0x11, 64 * MiB);  // the KV cache's addresses are usable again
  EXPECT_EQ(expanse_pool_is_asleep(weights), 0);
  EXPECT_EQ(expanse_pool_is_asleep(987654321), -EXPANSE_EINVAL);
  EXPECT_POOL_ERROR(expanse_pool_sleep(weights, 3, nullptr), EXPANSE_EINVAL, weights, "mode 3");

  // Not while a capture is routed into the pool (its graph is being recorded).
  CUstream s = stream();
  ASSERT_EQ(expanse_pool_begin_capture(kv, cs(s)), EXPANSE_OK) << expanse_last_error();
  EXPECT_POOL_ERROR(expanse_pool_sleep(kv, EXPANSE_SLEEP_DISCARD, nullptr), EXPANSE_EBUSY, kv,
                    "capture");
  ASSERT_EQ(expanse_pool_end(kv), EXPANSE_OK);

  must_free(w, 0, 0, nullptr);
  must_free(k, 0, 0, nullptr);
  must_free(other, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_release(weights), EXPANSE_OK);
  ASSERT_EQ(expanse_pool_release(kv), EXPANSE_OK);
  ASSERT_EQ(expanse_release_host_backup(0), EXPANSE_OK);
}


// ---- review tests (adversarial) ----------------------------------------------------------

// A capture route begun on CU_STREAM_PER_THREAD matches by handle value (pool_routes.cpp:264):
// every thread's per-thread stream has that value, so another thread's capture on its own
// per-thread stream is routed to this route's pool.
TEST_P(Pools, CaptureRouteOnThePerThreadStreamTakesItsOwnThreadsCaptureOnly) {
  start("sim_capacity:1GiB");
  const expanse_pool_id p = create();
  const expanse_pool_id q = create();
  CUcontext ctx = primary(0);
  push(0);
  ASSERT_EQ(expanse_pool_begin_capture(p, cs(CU_STREAM_PER_THREAD)), EXPANSE_OK)
      << expanse_last_error();
  ASSERT_EQ(t().stream_begin_capture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            CUDA_SUCCESS);
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;
  std::thread b([&] {
    EXPECT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
    EXPECT_EQ(expanse_pool_begin_capture(q, cs(CU_STREAM_PER_THREAD)), EXPANSE_OK)
        << expanse_last_error();
    EXPECT_EQ(t().stream_begin_capture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              CUDA_SUCCESS);
    {
      std::lock_guard<std::mutex> l(m);
      phase = 1;
    }
    cv.notify_all();
    {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return phase == 2; });
    }
    CUgraph g = nullptr;
    EXPECT_EQ(t().stream_end_capture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);
    if (g != nullptr) t().graph_destroy(g);
    EXPECT_EQ(expanse_pool_end(q), EXPANSE_OK) << expanse_last_error();
    CUcontext c = nullptr;
    t().ctx_pop_current(&c);
  });
  {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return phase == 1; });
  }
  // Thread A's own capture allocates: it must land in A's pool p.
  void* x = must_malloc(2 * MiB, 0, CU_STREAM_PER_THREAD);
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(x, &of), EXPANSE_OK);
  EXPECT_EQ(of, p) << "thread A's capture allocation went to pool " << of
                   << " (thread B's pool is " << q << ")";
  {
    std::lock_guard<std::mutex> l(m);
    phase = 2;
  }
  cv.notify_all();
  b.join();
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK);
  pop();
  must_free(x, 2 * MiB, 0, CU_STREAM_PER_THREAD);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
  ASSERT_EQ(expanse_pool_release(q), EXPANSE_OK);
}

// After a sleep/wake cycle the pool's free memory is mapped as one large handle per free run
// (core/sleep_wake.cpp wake_locked -> ensure_pages on free blocks); find_in_pool only takes placements
// whose handles it holds whole (HandleFit::ready), so the pool stops reusing its own cached memory.
TEST_P(Pools, AfterWakeThePoolReusesItsFreeMemory) {
  start("sim_capacity:1GiB");
  const expanse_pool_id p = create();
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back(expanse_pool_malloc(p, 8 * MiB, nullptr));
    ASSERT_NE(v.back(), nullptr) << expanse_last_error();
  }
  for (void* x : v) must_free(x, 0, 0, nullptr);
  const uint64_t phys = stats_of(p).physical_bytes;
  void* a = expanse_pool_malloc(p, 8 * MiB, nullptr);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(stats_of(p).physical_bytes, phys) << "before sleep: reused";
  must_free(a, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_sleep(p, EXPANSE_SLEEP_DISCARD, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_pool_wake(p, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(stats_of(p).physical_bytes, phys);
  void* b = expanse_pool_malloc(p, 8 * MiB, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(stats_of(p).physical_bytes, phys)
      << "after wake the pool took new pages instead of reusing its " << phys << " cached bytes";
  must_free(b, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
}

// Releasing an asleep pool frees its host backup while its live blocks are still asleep
// (device_pools.cpp release_pool); wake is refused for a released pool, so their content is
// gone and their pages stay unmapped, although "its live blocks stay valid" (expanse.h).
TEST_P(Pools, ReleasingAnAsleepPoolKeepsItsLiveBlocksWakeable) {
  start("sim_capacity:1GiB");
  const expanse_pool_id p = create();
  void* w = expanse_pool_malloc(p, 4 * MiB, nullptr);
  ASSERT_NE(w, nullptr);
  std::memset(w, 0x5a, 4 * MiB);
  ASSERT_EQ(expanse_pool_sleep(p, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
  EXPECT_GE(stats_of(p).host_backup_bytes, 4 * MiB) << "the live block's content was dropped";
  EXPECT_EQ(expanse_pool_wake(p, nullptr), EXPANSE_OK)
      << "no way to get the live block back: " << expanse_last_error();
  const std::vector<unsigned char> want(4 * MiB, 0x5a);
  EXPECT_EQ(std::memcmp(w, want.data(), want.size()), 0) << "its bytes came back";
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(w, &of), EXPANSE_OK);
  must_free(w, 0, 0, nullptr);
}

// A filter route's ctx may be freed once expanse_pool_end returns: the end waits for the
// allocations still calling the filter.
TEST_P(Pools, NoFilterCallOutlivesTheEndOfItsRoute) {
  start("sim_capacity:1GiB");
  const expanse_pool_id p = create();
  struct Ctx {
    std::atomic<bool> freed{false};
    std::atomic<bool> in_call{false};
    std::atomic<int> late{0};
  } ctx;
  auto filter = [](CUstream_st*, void* c) -> int {
    auto* x = static_cast<Ctx*>(c);
    x->in_call = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow filter
    if (x->freed) ++x->late;
    return 1;
  };
  ASSERT_EQ(expanse_pool_begin_filter(p, filter, &ctx), EXPANSE_OK) << expanse_last_error();
  void* got = nullptr;
  std::thread t([&] { got = expanse_malloc(MiB, 0, nullptr); });
  while (!ctx.in_call) std::this_thread::yield();
  ASSERT_EQ(expanse_pool_end(p), EXPANSE_OK) << expanse_last_error();
  ctx.freed = true;  // the application frees ctx now
  t.join();
  EXPECT_EQ(ctx.late, 0) << "the filter ran after expanse_pool_end returned";
  ASSERT_NE(got, nullptr);
  must_free(got, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_release(p), EXPANSE_OK);
}

INSTANTIATE_TEST_SUITE_P(Drivers, Pools, ::testing::Values("sim", "simcuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
