// Pinned host memory through the C ABI (expanse_host_*) on the sim's HOST_NUMA pages: exact
// blocks, a contiguous request after fragmentation served by moving pages, stream-ordered reuse,
// every misuse a clear error with nothing lost, driver failures leaving the pool consistent.
#include "driver_api/entry_points.hpp"
#include "expanse/expanse.h"
#include "sim/sim.hpp"
#include "sim/sim_entry.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t kPage = 2 * MiB;

expanse_host_stats host_stats(int node = 0) {
  expanse_host_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(expanse_host_get_stats(node, &s), EXPANSE_OK) << expanse_last_error();
  return s;
}

bool has(const std::string& what) {
  return std::string(expanse_last_error()).find(what) != std::string::npos;
}

void fill(void* p, size_t n, unsigned char v) { std::memset(p, v, n); }
bool holds(const void* p, size_t n, unsigned char v) {
  const auto* b = static_cast<const unsigned char*>(p);
  return b[0] == v && b[n / 2] == v && b[n - 1] == v;
}

// Device d's primary context, retained for a test's own driver calls; current() makes it the
// calling thread's. Released, and the thread left with none, at the end of the scope.
class PrimaryContext {
 public:
  explicit PrimaryContext(int d) {
    EXPECT_EQ(expanse::sim::sim_device_get(&dev_, d), CUDA_SUCCESS);
    EXPECT_EQ(expanse::sim::sim_device_primary_ctx_retain(&ctx_, dev_), CUDA_SUCCESS);
  }
  ~PrimaryContext() {
    expanse::sim::sim_ctx_set_current(nullptr);
    expanse::sim::sim_device_primary_ctx_release(dev_);
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  void current() const { EXPECT_EQ(expanse::sim::sim_ctx_set_current(ctx_), CUDA_SUCCESS); }

 private:
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

// The device-0 context made current for a test's own driver calls, and a non-blocking stream of
// it (a PyTorch side stream: a legacy-stream event does not cover its work).
class SideStream {
 public:
  explicit SideStream(unsigned flags = CU_STREAM_NON_BLOCKING) {
    ctx_.current();
    EXPECT_EQ(expanse::sim::sim_stream_create(&s_, flags), CUDA_SUCCESS);
  }
  ~SideStream() {
    expanse::sim::release_all();
    expanse::sim::sim_stream_destroy(s_);
  }
  CUstream get() const { return s_; }

 private:
  PrimaryContext ctx_{0};
  CUstream s_ = nullptr;
};

class HostPoolTest : public ::testing::Test {
 protected:
  void start(const std::string& extra = "") {
    ASSERT_EQ(expanse_init(("driver:sim,sim_devices:2,sim_capacity:1GiB,sim_host_capacity:256MiB,"
                            "host_limit:64MiB" + extra).c_str()),
              EXPANSE_OK)
        << expanse_last_error();
  }
  void TearDown() override {
    expanse::sim::clear_injections();
    EXPECT_EQ(expanse_host_release_cached(), EXPANSE_OK) << expanse_last_error();
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  }
};

// Pinned bytes are the request rounded to the granularity: 20 MiB + 1 byte pins 22 MiB, where a
// power-of-two allocator pins 32.
TEST_F(HostPoolTest, APinnedBlockIsTheRequestRoundedToTheGranularity) {
  start();
  for (size_t size : {size_t{20} * MiB + 1, size_t{3} * MiB, kPage, size_t{33} * MiB - 4096}) {
    void* p = nullptr;
    ASSERT_EQ(expanse_host_malloc(&p, size, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    fill(p, size, 0x3c);
    const expanse_host_stats s = host_stats();
    const size_t want = (size + kPage - 1) / kPage * kPage;
    EXPECT_EQ(s.pinned_bytes, want) << size;
    EXPECT_EQ(s.allocated_bytes, want);
    EXPECT_EQ(s.requested_bytes, size);
    EXPECT_EQ(s.page_bytes, kPage);
    EXPECT_TRUE(holds(p, size, 0x3c));
    ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK) << expanse_last_error();
    ASSERT_EQ(expanse_host_release_cached(), EXPANSE_OK) << expanse_last_error();
    EXPECT_EQ(host_stats().pinned_bytes, 0u);
  }
}

// Small blocks share pages: a hundred 4 KiB blocks pin one page.
TEST_F(HostPoolTest, SmallBlocksArePacked) {
  start();
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) {
    void* p = nullptr;
    ASSERT_EQ(expanse_host_malloc(&p, 4096, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    fill(p, 4096, static_cast<unsigned char>(i));
    blocks.push_back(p);
  }
  EXPECT_EQ(host_stats().pinned_bytes, kPage);
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(holds(blocks[static_cast<size_t>(i)], 4096, static_cast<unsigned char>(i))) << i;
    EXPECT_EQ(expanse_host_free(blocks[static_cast<size_t>(i)], nullptr), EXPANSE_OK);
  }
}

// Under a 64 MiB limit, 32 one-page blocks with every other freed leave 32 MiB free in 2 MiB
// holes; a 32 MiB request fits only by moving those pages, and the live blocks keep their bytes.
TEST_F(HostPoolTest, AContiguousRequestAfterFragmentationFitsWheneverThePagesExist) {
  start();
  std::vector<void*> blocks(32);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(expanse_host_malloc(&blocks[i], kPage, 0, nullptr), EXPANSE_OK)
        << expanse_last_error();
    fill(blocks[i], kPage, static_cast<unsigned char>(i));
  }
  for (size_t i = 0; i < blocks.size(); i += 2) {
    ASSERT_EQ(expanse_host_free(blocks[i], nullptr), EXPANSE_OK);
  }
  void* big = nullptr;
  ASSERT_EQ(expanse_host_malloc(&big, 32 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(big, 32 * MiB, 0xee);
  const expanse_host_stats s = host_stats();
  EXPECT_LE(s.pinned_bytes, 64 * MiB) << "within the limit";
  EXPECT_GE(s.num_remapped_pages, 16u) << "the holes' pages moved";
  for (size_t i = 1; i < blocks.size(); i += 2) {
    EXPECT_TRUE(holds(blocks[i], kPage, static_cast<unsigned char>(i))) << i;
    EXPECT_EQ(expanse_host_free(blocks[i], nullptr), EXPANSE_OK);
  }
  EXPECT_TRUE(holds(big, 32 * MiB, 0xee));
  // One page more than exists within the limit: out of memory, saying so, nothing lost.
  void* more = nullptr;
  EXPECT_EQ(expanse_host_malloc(&more, 32 * MiB + 1, 0, nullptr), EXPANSE_ENOMEM);
  EXPECT_TRUE(has("host allocation of")) << expanse_last_error();
  EXPECT_EQ(more, nullptr);
  EXPECT_TRUE(holds(big, 32 * MiB, 0xee));
  EXPECT_EQ(expanse_host_free(big, nullptr), EXPANSE_OK);
}

// A block freed with a stream whose work is still running is not reused until that work is done:
// the next request gets other memory, and one that needs its pages waits for the stream.
TEST_F(HostPoolTest, AFreedBlockIsReusedOnlyAfterItsStreamsWorkIsDone) {
  start(",sim_gpu_lag:1000000");
  void* a = nullptr;
  ASSERT_EQ(expanse_host_malloc(&a, 32 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_free(a, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().pending_blocks, 1u);
  void* b = nullptr;
  ASSERT_EQ(expanse_host_malloc(&b, 32 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  const auto ai = reinterpret_cast<uintptr_t>(a);
  const auto bi = reinterpret_cast<uintptr_t>(b);
  EXPECT_TRUE(bi >= ai + 32 * MiB || bi + 32 * MiB <= ai) << "reused while its stream ran";
  EXPECT_EQ(host_stats().num_waits, 0u);
  // The limit is reached: a third block needs a's pages and waits for its stream.
  void* c = nullptr;
  ASSERT_EQ(expanse_host_malloc(&c, 32 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().num_waits, 1u);
  EXPECT_EQ(host_stats().pending_blocks, 0u);
  EXPECT_EQ(expanse_host_free(b, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_free(c, nullptr), EXPANSE_OK);
}

// Each misuse is refused, named, and changes nothing.
TEST_F(HostPoolTest, MisuseIsAClearErrorAndNothingIsLost) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 3 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(p, 3 * MiB, 0x77);
  int local = 0;
  EXPECT_EQ(expanse_host_free(&local, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("not memory expanse_host_malloc returned")) << expanse_last_error();
  EXPECT_EQ(expanse_host_free(static_cast<char*>(p) + 4096, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("interior pointer")) << expanse_last_error();
  void* dev = expanse_malloc(MiB, 1, nullptr);
  ASSERT_NE(dev, nullptr) << expanse_last_error();
  EXPECT_EQ(expanse_host_free(dev, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("a device block of device 1")) << expanse_last_error();
  EXPECT_EQ(expanse_free_checked(dev, MiB, 1, nullptr), EXPANSE_OK);
  void* q = nullptr;
  EXPECT_EQ(expanse_host_malloc(&q, 0, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_host_malloc(&q, MiB, -5, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("NUMA node -5")) << expanse_last_error();
  EXPECT_EQ(expanse_host_malloc(&q, MiB, 7, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("NUMA node 7")) << expanse_last_error();
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(expanse_host_malloc(nullptr, MiB, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_host_record_stream(&local, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(holds(p, 3 * MiB, 0x77));
  EXPECT_EQ(host_stats().live_blocks, 1u);
  ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_free(p, nullptr), EXPANSE_EINVAL) << "a double free";
  EXPECT_TRUE(has("freed already")) << expanse_last_error();
  EXPECT_EQ(host_stats().live_blocks, 0u);
}

// A driver failure on any call of a request (create, map, access) fails that request only: the
// pool's books hold, live blocks keep their bytes, and the next request succeeds.
TEST_F(HostPoolTest, ADriverFailureLeavesThePoolConsistent) {
  start();
  void* keep = nullptr;
  ASSERT_EQ(expanse_host_malloc(&keep, 4 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(keep, 4 * MiB, 0x42);
  using expanse::driver::EntryPoint;
  for (EntryPoint e : {EntryPoint::mem_create, EntryPoint::mem_map, EntryPoint::mem_set_access}) {
    for (int nth : {1, 2, 3}) {
      expanse::sim::inject_failure(e, static_cast<uint64_t>(nth), CUDA_ERROR_UNKNOWN);
      void* p = nullptr;
      const int rc = expanse_host_malloc(&p, 8 * MiB, 0, nullptr);
      expanse::sim::clear_injections();
      if (rc == EXPANSE_OK) {
        EXPECT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
      } else {
        EXPECT_EQ(rc, EXPANSE_EDRIVER) << expanse_last_error();
        EXPECT_EQ(p, nullptr);
      }
      const expanse_host_stats s = host_stats();
      EXPECT_EQ(s.live_blocks, 1u);
      EXPECT_EQ(s.requested_bytes, 4 * MiB);
      EXPECT_TRUE(holds(keep, 4 * MiB, 0x42));
      ASSERT_EQ(expanse_host_malloc(&p, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
      fill(p, 8 * MiB, 0x11);
      EXPECT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
    }
  }
  EXPECT_EQ(expanse_host_free(keep, nullptr), EXPANSE_OK);
}

// A driver without host VMM falls back to mmap + cuMemHostRegister per block, and says so (path
// 2): blocks exact to the host page, freed ones unpinned only after their stream's work, the
// limit kept, misuse refused.
TEST_F(HostPoolTest, WithoutHostVmmTheRegisteredFallbackSaysWhatItIs) {
  start(",sim_host_numa:false,sim_gpu_lag:1000000");
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 3 * MiB + 1, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(p, 3 * MiB + 1, 0x21);
  expanse_host_stats s = host_stats();
  EXPECT_EQ(s.path, 2u);
  EXPECT_EQ(s.page_bytes, 4096u);
  EXPECT_EQ(s.pinned_bytes, 3 * MiB + 4096) << "exact to the host page";
  EXPECT_EQ(expanse::sim::outstanding().host_registrations, 1u);
  ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK) << expanse_last_error();
  s = host_stats();
  EXPECT_EQ(s.pending_blocks, 1u) << "unpinned only after the stream's work";
  EXPECT_EQ(expanse::sim::outstanding().host_registrations, 1u);
  ASSERT_EQ(expanse_host_set_limit(4 * MiB), EXPANSE_OK);
  // Beyond the limit while the freed block is pending: the request waits for it.
  ASSERT_EQ(expanse_host_malloc(&p, 2 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  s = host_stats();
  EXPECT_EQ(s.num_waits, 1u);
  EXPECT_EQ(s.pending_blocks, 0u);
  void* q = nullptr;
  EXPECT_EQ(expanse_host_malloc(&q, 3 * MiB, 0, nullptr), EXPANSE_ENOMEM) << "beyond the limit";
  EXPECT_TRUE(has("host_limit")) << expanse_last_error();
  EXPECT_EQ(expanse_host_free(static_cast<char*>(p) + 8, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("interior pointer")) << expanse_last_error();
  ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
  ASSERT_EQ(expanse_host_release_cached(), EXPANSE_OK);
  ASSERT_EQ(expanse_host_set_limit(SIZE_MAX), EXPANSE_OK);
}

// A sleeping pool's bytes are staged in the host pool: exact, reused by the next sleep without new
// pinning, given back with expanse_release_host_backup; the stats count them as pinned, not live.
TEST_F(HostPoolTest, SleepStagesItsBytesInTheHostPool) {
  start();
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 6 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, 6 * MiB, 0x6b);
  ASSERT_EQ(expanse_pool_sleep(id, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK)
      << expanse_last_error();
  expanse_host_stats s = host_stats();
  EXPECT_EQ(s.pinned_bytes, 6 * MiB) << "the staging, exact";
  EXPECT_EQ(s.live_blocks, 0u) << "staging is not the application's";
  const uint64_t created = s.num_created_pages;
  ASSERT_EQ(expanse_pool_wake(id, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_TRUE(holds(p, 6 * MiB, 0x6b));
  ASSERT_EQ(expanse_pool_sleep(id, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK);
  EXPECT_EQ(host_stats().num_created_pages, created) << "the next sleep pins nothing new";
  ASSERT_EQ(expanse_pool_wake(id, nullptr), EXPANSE_OK);
  EXPECT_TRUE(holds(p, 6 * MiB, 0x6b));
  ASSERT_EQ(expanse_release_host_backup(0), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_release_cached(), EXPANSE_OK);
  EXPECT_EQ(host_stats().pinned_bytes, 0u) << "given back";
  EXPECT_EQ(expanse_free_checked(p, 6 * MiB, 0, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by the fuzzer: a stale host pointer (freed, its memory since reused for a sleeping pool's
// staging) freed the staging, and the wake copied back from unmapped memory. Now it is refused.
TEST_F(HostPoolTest, AStalePointerCannotFreeASleepingPoolsStaging) {
  start();
  void* stale = nullptr;
  ASSERT_EQ(expanse_host_malloc(&stale, 6 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_free(stale, nullptr), EXPANSE_OK);
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 6 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, 6 * MiB, 0x5d);
  ASSERT_EQ(expanse_pool_sleep(id, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_free(stale, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("staging")) << expanse_last_error();
  EXPECT_EQ(expanse_host_record_stream(stale, nullptr), EXPANSE_EINVAL);
  ASSERT_EQ(expanse_pool_wake(id, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_TRUE(holds(p, 6 * MiB, 0x5d));
  EXPECT_EQ(expanse_free_checked(p, 6 * MiB, 0, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
  EXPECT_EQ(expanse_release_host_backup(0), EXPANSE_OK);
}

// Found by review: a free with a NULL stream recorded its event on the pool's context's legacy
// stream, not the calling thread's, so a copy issued there on device 1 could still be running
// when the block was handed out again. The event goes where the caller's NULL stream is.
TEST_F(HostPoolTest, ANullStreamIsTheCallersContextsNotThePools) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  PrimaryContext ctx1(1);
  ctx1.current();
  expanse::sim::hold_stream(nullptr);  // device 1's legacy stream: a copy still running there
  ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_host_malloc(&q, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_NE(q, p) << "handed out while device 1's work on it ran";
  EXPECT_EQ(host_stats().pending_blocks, 1u);
  expanse::sim::release_all();
  EXPECT_EQ(expanse_host_free(q, nullptr), EXPANSE_OK);
}

// Found by review: a host request polled the freed blocks' events, and mapped and granted new
// pages, while the application captured a CUDA graph; either invalidates a global-mode capture.
// With a capture announced, a request that would need either is refused, saying why, and the
// capture survives; after it, the same request succeeds.
TEST_F(HostPoolTest, AHostRequestDuringAnAnnouncedCaptureDoesNotBreakIt) {
  start();
  void* a = nullptr;
  ASSERT_EQ(expanse_host_malloc(&a, 4 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_free(a, nullptr), EXPANSE_OK);  // proven free only by a later poll
  SideStream side;
  const CUstream s = side.get();
  ASSERT_EQ(expanse_capture_begin(s), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse::sim::sim_stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_SUCCESS);
  void* b = nullptr;
  EXPECT_EQ(expanse_host_malloc(&b, 4 * MiB, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("during an announced graph capture")) << expanse_last_error();
  EXPECT_EQ(b, nullptr);
  CUgraph g = nullptr;
  EXPECT_EQ(expanse::sim::sim_stream_end_capture(s, &g), CUDA_SUCCESS) << "the capture survived";
  ASSERT_EQ(expanse_capture_end(s), EXPANSE_OK);
  if (g != nullptr) expanse::sim::sim_graph_destroy(g);
  ASSERT_EQ(expanse_host_malloc(&b, 4 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(b, a) << "a's pages, proven free after the capture";
  EXPECT_EQ(expanse_host_free(b, nullptr), EXPANSE_OK);
}

// Shutdown refuses while host blocks are live (as for device blocks), and succeeds after.
TEST_F(HostPoolTest, ShutdownWaitsForLiveHostBlocks) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_shutdown(), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
}

}  // namespace

// ---- frees that name no stream (a tensor's deleter) --------------------------------------------

// A block freed after the device (no stream named) while a copy from it still runs on a side
// stream is not handed out again until that copy is done: the request that needs its memory
// synchronizes the device first, so the copy reads the bytes it was given, and the pool does not
// pin new pages beside the freed ones. A free that ignored the side stream hands the range out at
// once, the new owner's bytes overwrite it, and the device receives them.
TEST_F(HostPoolTest, ABlockFreedAfterTheDeviceWaitsForEveryStreamOfIt) {
  start();
  SideStream side;
  void* a = nullptr;
  ASSERT_EQ(expanse_host_malloc(&a, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(a, 8 * MiB, 0xa1);
  void* d = expanse_malloc(8 * MiB, 0, side.get());
  ASSERT_NE(d, nullptr) << expanse_last_error();
  expanse::sim::hold_stream(side.get());  // the copy is still running
  ASSERT_EQ(expanse::sim::sim_memcpy_htod_async(reinterpret_cast<CUdeviceptr>(d), a, 8 * MiB,
                                                side.get()),
            CUDA_SUCCESS);
  ASSERT_EQ(expanse_host_free_after_device(a, 0, 0), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().pending_blocks, 1u);
  const uint64_t pinned = host_stats().pinned_bytes;
  void* b = nullptr;
  ASSERT_EQ(expanse_host_malloc(&b, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  fill(b, 8 * MiB, 0xb2);  // the new owner writes
  EXPECT_EQ(host_stats().num_waits, 1u) << "the request synchronized the device";
  EXPECT_EQ(host_stats().pinned_bytes, pinned) << "no page pinned beside the freed block";
  EXPECT_EQ(host_stats().pending_blocks, 0u);
  std::vector<unsigned char> got(8 * MiB);
  ASSERT_EQ(expanse::sim::sim_ctx_synchronize(), CUDA_SUCCESS);
  ASSERT_EQ(expanse::sim::sim_memcpy_dtoh(got.data(), reinterpret_cast<CUdeviceptr>(d), 8 * MiB),
            CUDA_SUCCESS);
  EXPECT_TRUE(holds(got.data(), 8 * MiB, 0xa1)) << "the copy read the next owner's bytes";
  EXPECT_EQ(expanse::sim::async_faults(), 0u);
  EXPECT_EQ(expanse_host_free(b, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(d, 8 * MiB, 0, side.get()), EXPANSE_OK) << expanse_last_error();
}

// Where the user named the streams (record_stream), a free after the device is ordered by those
// streams' events alone: no synchronize, and the block comes back once they are done.
TEST_F(HostPoolTest, AFreeAfterTheDeviceUsesTheStreamsTheUserNamed) {
  start();
  SideStream side;
  void* a = nullptr;
  ASSERT_EQ(expanse_host_malloc(&a, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_record_stream(a, side.get()), EXPANSE_OK) << expanse_last_error();
  expanse::sim::hold_stream(side.get());
  ASSERT_EQ(expanse_host_free_after_device(a, 0, 0), EXPANSE_OK) << expanse_last_error();
  void* b = nullptr;
  ASSERT_EQ(expanse_host_malloc(&b, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  const auto ai = reinterpret_cast<uintptr_t>(a);
  const auto bi = reinterpret_cast<uintptr_t>(b);
  EXPECT_TRUE(bi >= ai + 8 * MiB || bi + 8 * MiB <= ai) << "reused while its stream ran";
  EXPECT_EQ(host_stats().num_waits, 0u) << "no synchronize: the named stream's event orders it";
  expanse::sim::release_stream(side.get());
  void* c = nullptr;
  ASSERT_EQ(expanse_host_malloc(&c, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(c, a) << "its stream done, the block's range is the best fit again";
  EXPECT_EQ(expanse_host_free(b, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_free(c, nullptr), EXPANSE_OK);
}

// A deleter loop (allocate, free after the device, allocate again) keeps the pinned pages at
// one block's, on the HOST_NUMA pool and on the registered fallback alike.
TEST_F(HostPoolTest, DeleterFreesDoNotGrowThePinnedMemory) {
  for (const char* extra : {"", ",sim_host_numa:false"}) {
    SCOPED_TRACE(extra);
    start(extra);
    for (int i = 0; i < 8; ++i) {
      void* p = nullptr;
      ASSERT_EQ(expanse_host_malloc(&p, 6 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
      ASSERT_EQ(expanse_host_free_after_device(p, -1, 0), EXPANSE_OK) << expanse_last_error();
    }
    EXPECT_LE(host_stats().peak_pinned_bytes, 2 * 6 * MiB);
    EXPECT_GE(host_stats().num_waits, 6u);
    EXPECT_EQ(expanse_host_release_cached(), EXPANSE_OK);
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  }
  start();
}

TEST_F(HostPoolTest, AFreeAfterTheDeviceRefusesMisuseByName) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_host_free_after_device(p, 7, 0), EXPANSE_EINVAL);
  EXPECT_TRUE(has("device 7")) << expanse_last_error();
  EXPECT_EQ(expanse_host_free_after_device(p, -3, 0), EXPANSE_EINVAL);
  EXPECT_TRUE(has("device -3")) << expanse_last_error();
  EXPECT_EQ(expanse_host_free_after_device(static_cast<char*>(p) + 512, 0, 0), EXPANSE_EINVAL);
  EXPECT_TRUE(has("interior pointer")) << expanse_last_error();
  int local = 0;
  EXPECT_EQ(expanse_host_free_after_device(&local, 0, 0), EXPANSE_EINVAL);
  EXPECT_TRUE(has("not memory expanse_host_malloc returned")) << expanse_last_error();
  EXPECT_EQ(host_stats().live_blocks, 1u) << "nothing was changed";
  ASSERT_EQ(expanse_host_free_after_device(p, 0, 0), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_host_free_after_device(p, 0, 0), EXPANSE_EINVAL);
  EXPECT_TRUE(has("freed already")) << expanse_last_error();
}

// ---- DLPack ------------------------------------------------------------------------------------

// The unversioned DLPack layout, as a consumer (torch.from_dlpack) reads it.
struct DLManaged {
  void* data;
  int32_t device_type;
  int32_t device_id;
  int32_t ndim;
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
  void* manager_ctx;
  void (*deleter)(DLManaged*);
};

TEST_F(HostPoolTest, ADLPackTensorCoversTheBlockAndItsDeleterFreesIt) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 3 * MiB + 5, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  void* m = nullptr;
  ASSERT_EQ(expanse_host_dlpack(p, 0, &m), EXPANSE_OK) << expanse_last_error();
  auto* t = static_cast<DLManaged*>(m);
  EXPECT_EQ(t->data, p);
  EXPECT_EQ(t->device_type, 1);  // kDLCPU
  EXPECT_EQ(t->ndim, 1);
  EXPECT_EQ(t->code, 1);  // kDLUInt
  EXPECT_EQ(t->bits, 8);
  EXPECT_EQ(t->lanes, 1);
  EXPECT_EQ(t->shape[0], static_cast<int64_t>(3 * MiB + 5));
  EXPECT_EQ(t->strides[0], 1);
  EXPECT_EQ(t->byte_offset, 0u);
  EXPECT_EQ(host_stats().live_blocks, 1u);
  t->deleter(t);
  EXPECT_EQ(host_stats().live_blocks, 0u) << "the deleter freed the block";
  EXPECT_EQ(host_stats().num_frees, 1u);
  // Misuse: refused by name, nothing made.
  EXPECT_EQ(expanse_host_dlpack(p, 0, &m), EXPANSE_EINVAL);
  EXPECT_EQ(m, nullptr);
  EXPECT_TRUE(has("not the start of a live block") || has("freed already")) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_host_malloc(&q, MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_host_dlpack(static_cast<char*>(q) + 4096, 0, &m), EXPANSE_EINVAL);
  EXPECT_TRUE(has("not the start of a live block")) << expanse_last_error();
  EXPECT_EQ(expanse_host_dlpack(q, 9, &m), EXPANSE_EINVAL);
  EXPECT_TRUE(has("device 9")) << expanse_last_error();
  EXPECT_EQ(expanse_host_dlpack(q, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_TRUE(has("managed_tensor")) << expanse_last_error();
  EXPECT_EQ(host_stats().live_blocks, 1u);
  EXPECT_EQ(expanse_host_free(q, nullptr), EXPANSE_OK);
}

// A synchronize while a blocking stream captures would invalidate the capture: a request that
// would prove a deleter's free so while one is under way (unannounced) pins new pages instead,
// and the capture survives. A later request, the capture over, synchronizes.
TEST_F(HostPoolTest, AFreeAfterTheDeviceIsNotProvenByASynchronizeDuringACapture) {
  start();
  SideStream blocking(CU_STREAM_DEFAULT);
  const CUstream s = blocking.get();
  void* a = nullptr;
  ASSERT_EQ(expanse_host_malloc(&a, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_host_free_after_device(a, 0, 0), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse::sim::sim_stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED),
            CUDA_SUCCESS);
  void* b = nullptr;
  ASSERT_EQ(expanse_host_malloc(&b, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().num_waits, 0u) << "no synchronize during the capture";
  EXPECT_EQ(host_stats().pending_blocks, 1u);
  CUgraph g = nullptr;
  EXPECT_EQ(expanse::sim::sim_stream_end_capture(s, &g), CUDA_SUCCESS) << "the capture survived";
  if (g != nullptr) expanse::sim::sim_graph_destroy(g);
  void* c = nullptr;
  ASSERT_EQ(expanse_host_malloc(&c, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().num_waits, 1u) << "the capture over, the request synchronized";
  EXPECT_EQ(host_stats().pending_blocks, 0u);
  EXPECT_EQ(expanse_host_free(b, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_free(c, nullptr), EXPANSE_OK);
}

// Found by review: record_stream with a NULL stream named the recording thread's context's
// legacy stream, but the event was recorded at the free in the freeing thread's context: a
// deleter running on another device's thread let the block be reused under device 1's copy.
// The named stream keeps the context it was named in.
TEST_F(HostPoolTest, ANamedNullStreamIsTheContextItWasNamedIn) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  PrimaryContext ctx0(0), ctx1(1);
  ctx1.current();
  expanse::sim::hold_stream(nullptr);  // device 1's legacy stream: the copy still runs there
  ASSERT_EQ(expanse_host_record_stream(p, nullptr), EXPANSE_OK) << expanse_last_error();
  ctx0.current();  // the deleter's thread
  ASSERT_EQ(expanse_host_free_after_device(p, -1, 0), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_host_malloc(&q, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_NE(q, p) << "handed out while device 1's work on it ran";
  EXPECT_EQ(host_stats().pending_blocks, 1u);
  expanse::sim::release_all();
  EXPECT_EQ(expanse_host_free(q, nullptr), EXPANSE_OK);
}

// expanse_host_block_of: the live block holding a pointer, for a tensor library that holds a
// slice; nothing else answers.
TEST_F(HostPoolTest, TheBlockHoldingAPointerIsFoundFromInsideIt) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 3 * MiB + 5, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  void* base = nullptr;
  size_t size = 0;
  for (size_t off : {size_t{0}, size_t{4096}, 3 * MiB + 4}) {
    ASSERT_EQ(expanse_host_block_of(static_cast<char*>(p) + off, &base, &size), EXPANSE_OK) << off;
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, 3 * MiB + 5);
  }
  EXPECT_EQ(expanse_host_block_of(static_cast<char*>(p) + 3 * MiB + 5, &base, &size),
            EXPANSE_EINVAL)
      << "past its requested bytes";
  EXPECT_EQ(base, nullptr);
  int local = 0;
  EXPECT_EQ(expanse_host_block_of(&local, &base, &size), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_host_block_of(p, nullptr, &size), EXPANSE_EINVAL);
  EXPECT_TRUE(has("must not be NULL")) << expanse_last_error();
  ASSERT_EQ(expanse_host_free(p, nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_host_block_of(p, &base, &size), EXPANSE_EINVAL) << "freed";
}

// Blocks freed after the device wait for a synchronize, and releasing the cache is the time to
// make it: their pages go back too.
TEST_F(HostPoolTest, ReleasingTheCacheProvesFreesAfterTheDevice) {
  for (const char* extra : {"", ",sim_host_numa:false"}) {
    SCOPED_TRACE(extra);
    start(extra);
    void* p = nullptr;
    ASSERT_EQ(expanse_host_malloc(&p, 6 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    ASSERT_EQ(expanse_host_free_after_device(p, 0, 0), EXPANSE_OK) << expanse_last_error();
    EXPECT_EQ(host_stats().pending_blocks, 1u);
    ASSERT_EQ(expanse_host_release_cached(), EXPANSE_OK) << expanse_last_error();
    EXPECT_EQ(host_stats().pending_blocks, 0u);
    EXPECT_EQ(host_stats().pinned_bytes, 0u);
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  }
  start();
}

// Found by review: a per-thread stream named by record_stream was resolved at the free on the
// freeing thread's per-thread stream, not the one that copied. It now counts as no stream named:
// the free waits for every stream of the device (a request that needs the memory synchronizes).
TEST_F(HostPoolTest, APerThreadStreamNamedOnAnotherThreadMeansEveryStream) {
  start();
  void* p = nullptr;
  ASSERT_EQ(expanse_host_malloc(&p, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  PrimaryContext ctx0(0);
  std::thread copier([&] {
    ctx0.current();
    expanse::sim::hold_stream(CU_STREAM_PER_THREAD);  // this thread's copy still runs
    EXPECT_EQ((expanse_host_record_stream)(p, CU_STREAM_PER_THREAD), EXPANSE_OK)
        << expanse_last_error();
    expanse::sim::sim_ctx_set_current(nullptr);
  });
  copier.join();
  ctx0.current();
  ASSERT_EQ(expanse_host_free_after_device(p, -1, 0), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_host_malloc(&q, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(host_stats().num_waits, 1u) << "reused without proof that the copier's stream passed";
  expanse::sim::release_all();
  EXPECT_EQ(expanse_host_free(q, nullptr), EXPANSE_OK);
}

// EXPANSE_HOST_EVERY_STREAM (a CUDA graph's block, which replays on any stream may read): the
// named streams' events do not prove the free; a synchronize does. Unknown flags are refused.
TEST_F(HostPoolTest, EveryStreamIgnoresTheNamedStreams) {
  start();
  SideStream side;
  for (unsigned flags : {0u, EXPANSE_HOST_EVERY_STREAM}) {
    SCOPED_TRACE(flags);
    const uint64_t waits = host_stats().num_waits;
    void* p = nullptr;
    ASSERT_EQ(expanse_host_malloc(&p, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    ASSERT_EQ(expanse_host_record_stream(p, side.get()), EXPANSE_OK);
    EXPECT_EQ(expanse_host_free_after_device(p, 0, 4u), EXPANSE_EINVAL);
    EXPECT_TRUE(has("unknown flags 4")) << expanse_last_error();
    ASSERT_EQ(expanse_host_free_after_device(p, 0, flags), EXPANSE_OK) << expanse_last_error();
    void* q = nullptr;
    ASSERT_EQ(expanse_host_malloc(&q, 8 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
    EXPECT_EQ(host_stats().num_waits - waits, flags == 0 ? 0u : 1u);
    EXPECT_EQ(expanse_host_free(q, nullptr), EXPANSE_OK);
    ASSERT_EQ(expanse_host_release_cached(), EXPANSE_OK);
  }
}
