// The allocator stays safe where the real driver is strict — streams of other contexts,
// destroyed streams whose handle values come back, per-thread default streams, stream capture,
// peer access, allocation properties, older drivers. Each case runs through the C ABI twice: on
// the in-process sim (driver:sim) and on libexpanse_simcuda.so loaded as the CUDA driver
// (driver:cuda,driver_library:...), where the test's own streams come from the same library.
#include "api/runtime.hpp"
#include "expanse/expanse.h"
#include "sim/sim.hpp"
#include "two_drivers_fixture.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;

using expanse::test::overlaps;

// Each case shuts down with nothing left in the driver (TwoDrivers::stop).
class StreamTruth : public expanse::test::TwoDrivers {};

void* must_malloc(size_t n, int dev, CUstream s) {
  void* p = expanse_malloc(n, dev, reinterpret_cast<CUstream_st*>(s));
  EXPECT_NE(p, nullptr) << expanse_last_error();
  return p;
}
void must_free(void* p, size_t n, int dev, CUstream s) {
  EXPECT_EQ(expanse_free_checked(p, n, dev, reinterpret_cast<CUstream_st*>(s)), EXPANSE_OK)
      << expanse_last_error();
}

// Finding 1: a stream of another context (device 1) used on a device-0 block. Its event must be
// recorded in its own context; before, INVALID_HANDLE was taken for "destroyed", device 0 was
// synchronized, and the block went to the freeing stream s2 while device 1's stream still ran.
TEST_P(StreamTruth, StreamOfAnotherDeviceIsWaitedFor) {
  start("sim_devices:2,sim_capacity:1GiB");
  CUstream s0 = stream(0), s2 = stream(0), s1 = stream(1);
  void* a = must_malloc(8 * MiB, 0, s0);
  ASSERT_EQ(expanse_record_stream(a, reinterpret_cast<CUstream_st*>(s1)), EXPANSE_OK)
      << expanse_last_error();
  hold_(s1);
  must_free(a, 8 * MiB, 0, s2);  // ordered on s2; s0 and device 1's s1 used it too
  std::vector<void*> got;
  for (int i = 0; i < 6; ++i) {
    void* b = must_malloc(8 * MiB, 0, s2);
    EXPECT_FALSE(overlaps(a, 8 * MiB, b, 8 * MiB)) << "reused while device 1's stream runs";
    got.push_back(b);
  }
  for (void* b : got) must_free(b, 8 * MiB, 0, s2);
  release_(s1);
}

// Finding 2: a destroyed stream's handle value comes back for the next stream created; the new
// stream must not inherit the dead one's freed blocks while its work still runs.
TEST_P(StreamTruth, RecycledHandleInheritsNothing) {
  start("sim_capacity:1GiB");
  CUstream s1 = stream(0);
  void* a = must_malloc(4 * MiB, 0, s1);
  hold_(s1);
  must_free(a, 4 * MiB, 0, s1);
  destroy(s1);
  CUstream s2 = stream(0);
  ASSERT_EQ(s2, s1) << "the sim recycles stream handles (the test needs it)";
  void* b = must_malloc(4 * MiB, 0, s2);
  EXPECT_FALSE(overlaps(a, 4 * MiB, b, 4 * MiB))
      << "the new stream got the destroyed stream's block while its work still ran";
  must_free(b, 4 * MiB, 0, s2);
}

// Finding 3: CU_STREAM_PER_THREAD is one stream per thread: thread B must not get thread A's
// freed block while A's work may still use it.
TEST_P(StreamTruth, PerThreadStreamsAreNotShared) {
  start("sim_capacity:1GiB");
  const CUcontext ctx = primary(0);
  auto* pts = reinterpret_cast<CUstream_st*>(CU_STREAM_PER_THREAD);
  void* a = nullptr;
  std::thread ta([&] {
    t().ctx_set_current(ctx);
    a = expanse_malloc(4 * MiB, 0, pts);
    hold_(CU_STREAM_PER_THREAD);
    expanse_free(a, 4 * MiB, 0, pts);
  });
  ta.join();
  ASSERT_NE(a, nullptr);
  void* b = nullptr;
  std::thread tb([&] {
    t().ctx_set_current(ctx);
    b = expanse_malloc(4 * MiB, 0, pts);
  });
  tb.join();
  ASSERT_NE(b, nullptr) << expanse_last_error();
  EXPECT_FALSE(overlaps(a, 4 * MiB, b, 4 * MiB)) << "thread B got thread A's block";
  must_free(b, 4 * MiB, 0, nullptr);
}

// NULL is the legacy default stream, one per context whichever thread names it: a block one
// thread freed on NULL is the next NULL allocation's at once, on any thread (the legacy stream
// orders the two uses), with no fence.
TEST_P(StreamTruth, NullStreamIsOneStreamAcrossThreads) {
  start("sim_capacity:1GiB");
  const CUcontext ctx = primary(0);
  void* a = nullptr;
  std::thread ta([&] {
    t().ctx_set_current(ctx);
    a = expanse_malloc(4 * MiB, 0, nullptr);
    hold_(nullptr);
    expanse_free(a, 4 * MiB, 0, nullptr);
  });
  ta.join();
  void* b = nullptr;
  std::thread tb([&] {
    t().ctx_set_current(ctx);
    b = expanse_malloc(4 * MiB, 0, nullptr);
  });
  tb.join();
  ASSERT_NE(b, nullptr) << expanse_last_error();
  EXPECT_EQ(b, a) << "the block freed on the legacy stream was not reused by its next allocation";
  release_(nullptr);
  must_free(b, 4 * MiB, 0, nullptr);
}

// With null_stream:per_thread (code built with --default-stream per-thread), NULL is each
// thread's own stream: a block freed on NULL by one thread is not handed to another thread's
// NULL before a fence proves the first thread's work done.
TEST_P(StreamTruth, NullStreamPerThreadIsNotSharedAcrossThreadsBeforeAFence) {
  start("sim_capacity:1GiB,null_stream:per_thread");
  const CUcontext ctx = primary(0);
  void* a = nullptr;
  std::thread ta([&] {
    t().ctx_set_current(ctx);
    a = expanse_malloc(4 * MiB, 0, nullptr);
    hold_(CU_STREAM_PER_THREAD);
    expanse_free(a, 4 * MiB, 0, nullptr);
  });
  ta.join();
  void* b = nullptr;
  std::thread tb([&] {
    t().ctx_set_current(ctx);
    b = expanse_malloc(4 * MiB, 0, nullptr);
  });
  tb.join();
  ASSERT_NE(b, nullptr) << expanse_last_error();
  EXPECT_FALSE(overlaps(a, 4 * MiB, b, 4 * MiB)) << "thread B's NULL got thread A's pending block";
  must_free(b, 4 * MiB, 0, nullptr);
}

// Finding 4: allocating and freeing while another stream captures a graph makes no prohibited
// call (the capture ends valid), and a block freed on the capturing stream is not handed to
// another stream before the capture has ended.
TEST_P(StreamTruth, CaptureIsNotBrokenAndItsFreesWait) {
  start("sim_capacity:1GiB");
  CUstream s1 = stream(0), cap = stream(0), s2 = stream(0);
  push(0);
  // Memory freed on s1 and still in use: the allocator will want to fence and query it.
  void* old = must_malloc(16 * MiB, 0, s1);
  hold_(s1);
  must_free(old, 16 * MiB, 0, s1);
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  void* a = must_malloc(8 * MiB, 0, cap);     // new pages during capture
  must_free(a, 8 * MiB, 0, cap);              // freed inside the capture
  void* b = must_malloc(8 * MiB, 0, s2);      // another stream: polls, must not break capture
  EXPECT_FALSE(overlaps(a, 8 * MiB, b, 8 * MiB)) << "a block freed in a capture went to s2";
  void* c = must_malloc(64 * MiB, 0, s2);
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
  if (g != nullptr) t().graph_destroy(g);
  pop();
  must_free(b, 8 * MiB, 0, s2);
  must_free(c, 64 * MiB, 0, s2);
  release_(s1);
}

// Found on an H100 (driver 580): thread B's expanse_release_cached synchronized the context
// while thread A captured on a stream expanse had never seen, and the capture was invalidated
// (cuCtxSynchronize -> 900). Only the application knows a capture is about to begin: announced
// with expanse_capture_begin, no context sync runs until expanse_capture_end; the memory that
// only a sync can prove free (freed on a stream destroyed with its work pending) is released
// after the capture instead. Without the announcement the capture is lost (the sim says so).
TEST_P(StreamTruth, AnnouncedCaptureSurvivesAnotherThreadsReleaseCached) {
  start("sim_capacity:1GiB");
  CUstream s1 = stream(0), cap = stream(0);
  auto* capc = reinterpret_cast<CUstream_st*>(cap);
  void* a = must_malloc(64 * MiB, 0, s1);
  hold_(s1);
  must_free(a, 64 * MiB, 0, s1);
  destroy(s1);  // its work still pending: only a context sync proves a's pages free
  push(0);
  ASSERT_EQ(expanse_capture_begin(capc), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  int released = -1;
  expanse_stats during{};
  during.struct_size = sizeof during;
  std::thread b([&] {
    released = expanse_release_cached(0);
    expanse_get_stats(0, &during);
  });
  b.join();
  EXPECT_EQ(released, EXPANSE_OK) << expanse_last_error();
  EXPECT_GE(during.physical_bytes, 64 * MiB) << "released pages no sync had proven free";
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_SUCCESS) << "the capture was invalidated";
  if (g != nullptr) t().graph_destroy(g);
  ASSERT_EQ(expanse_capture_end(capc), EXPANSE_OK) << expanse_last_error();
  pop();
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  expanse_stats after{};
  after.struct_size = sizeof after;
  ASSERT_EQ(expanse_get_stats(0, &after), EXPANSE_OK);
  EXPECT_EQ(after.physical_bytes, 0u) << "the capture's end did not let the sync run again";
}

TEST_P(StreamTruth, UnannouncedCaptureIsLostToAnotherThreadsReleaseCached) {
  start("sim_capacity:1GiB");
  CUstream s1 = stream(0), cap = stream(0);
  void* a = must_malloc(64 * MiB, 0, s1);
  hold_(s1);
  must_free(a, 64 * MiB, 0, s1);
  destroy(s1);
  push(0);
  ASSERT_EQ(t().stream_begin_capture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  std::thread b([&] { expanse_release_cached(0); });
  b.join();
  CUgraph g = nullptr;
  EXPECT_EQ(t().stream_end_capture(cap, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
      << "the sim no longer shows why announcing is needed";
  if (g != nullptr) t().graph_destroy(g);
  pop();
}

// The announcement names the capture's context through its stream; a NULL stream with no
// context current names none, and the error says so.
TEST_P(StreamTruth, CaptureAnnouncementNeedsAContext) {
  start("sim_capacity:1GiB");
  int rc = EXPANSE_OK;
  std::string msg;
  std::thread b([&] {  // a fresh thread: no context current
    rc = expanse_capture_begin(nullptr);
    msg = expanse_last_error();
  });
  b.join();
  EXPECT_EQ(rc, EXPANSE_EDRIVER);
  EXPECT_NE(msg.find("expanse_capture_begin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("current context"), std::string::npos) << msg;
}

// Finding 5: every device that can access device 0 gets access to its mappings, present and
// future (peer_access:auto); peer_access:none grants only the owner until
// expanse_enable_peer_access.
CUmemAccess_flags access_of(const expanse::driver::DriverTable& t, void* p, int dev) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;  // CUmemLocation names devices by ordinal
  unsigned long long flags = 0;
  EXPECT_EQ(t.mem_get_access(&flags, &loc, reinterpret_cast<CUdeviceptr>(p)), CUDA_SUCCESS);
  return static_cast<CUmemAccess_flags>(flags);
}

TEST_P(StreamTruth, PeersGetAccessByDefault) {
  start("sim_devices:2,sim_capacity:1GiB");
  void* a = must_malloc(4 * MiB, 0, nullptr);
  EXPECT_EQ(access_of(t(), a, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(access_of(t(), a, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  must_free(a, 4 * MiB, 0, nullptr);
}

TEST_P(StreamTruth, PeerAccessNoneThenEnabled) {
  start("sim_devices:2,sim_capacity:1GiB,peer_access:none");
  void* a = must_malloc(4 * MiB, 0, nullptr);
  EXPECT_EQ(access_of(t(), a, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  ASSERT_EQ(expanse_enable_peer_access(0, 1), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(access_of(t(), a, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);  // present
  void* b = must_malloc(64 * MiB, 0, nullptr);
  EXPECT_EQ(access_of(t(), b, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);  // future
  EXPECT_EQ(expanse_enable_peer_access(0, 7), EXPANSE_EINVAL);
  must_free(a, 4 * MiB, 0, nullptr);
  must_free(b, 64 * MiB, 0, nullptr);
}

TEST_P(StreamTruth, NoPeerAccessWhereTheDriverSaysNo) {
  start("sim_devices:2,sim_capacity:1GiB,sim_peer_access:false");
  void* a = must_malloc(4 * MiB, 0, nullptr);
  EXPECT_EQ(access_of(t(), a, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  EXPECT_EQ(expanse_enable_peer_access(0, 1), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("cuDeviceCanAccessPeer"), std::string::npos)
      << expanse_last_error();
  must_free(a, 4 * MiB, 0, nullptr);
}

// Finding 6: cuMemCreate asks for POSIX fd handles and RDMA where the device supports them.
CUmemAllocationProp props_of(const expanse::driver::DriverTable& t, void* p) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop{};
  EXPECT_EQ(t.mem_retain_allocation_handle(&h, p), CUDA_SUCCESS);
  EXPECT_EQ(t.mem_get_allocation_properties_from_handle(&prop, h), CUDA_SUCCESS);
  t.mem_release(h);
  return prop;
}

TEST_P(StreamTruth, AllocationsAreExportableAndRdmaCapable) {
  start("sim_capacity:1GiB");
  void* a = must_malloc(4 * MiB, 0, nullptr);
  CUmemAllocationProp p = props_of(t(), a);
  EXPECT_EQ(p.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(p.allocFlags.gpuDirectRDMACapable, 1);
  must_free(a, 4 * MiB, 0, nullptr);
}

TEST_P(StreamTruth, RdmaOffOrUnsupportedIsNotAskedFor) {
  for (const char* conf : {"sim_capacity:1GiB,rdma:off", "sim_capacity:1GiB,sim_rdma:false",
                           "sim_capacity:1GiB,sim_posix_fd:false"}) {
    SCOPED_TRACE(conf);
    start(conf);
    void* a = must_malloc(4 * MiB, 0, nullptr);
    ASSERT_NE(a, nullptr);
    CUmemAllocationProp p = props_of(t(), a);
    const bool fd = std::string(conf).find("posix_fd") == std::string::npos;
    EXPECT_EQ(p.requestedHandleTypes,
              fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE);
    EXPECT_EQ(p.allocFlags.gpuDirectRDMACapable, fd ? 0 : 1);
    std::memset(a, 1, 4 * MiB);  // and the memory works
    must_free(a, 4 * MiB, 0, nullptr);
    stop();
  }
}

// Finding 6 on WSL2 (pytorch/pytorch#192330, an NVIDIA WSL driver bug fixed in R615): the device
// says RDMA with VMM is supported, cuMemCreate and cuMemMap accept the flag, and cuMemSetAccess
// fails. expanse finds out once per device (a one-page probe) and allocates without the flag;
// before, every allocation failed. The probe leaves nothing in the stats.
TEST_P(StreamTruth, WslRdmaIsDroppedAndMemoryWorks) {
  uint64_t creates[2] = {0, 0};
  for (int wsl = 0; wsl < 2; ++wsl) {
    start(wsl ? "sim_capacity:1GiB,sim_rdma:wsl" : "sim_capacity:1GiB");
    void* a = must_malloc(4 * MiB, 0, nullptr);
    ASSERT_NE(a, nullptr);
    CUmemAllocationProp p = props_of(t(), a);
    EXPECT_EQ(p.allocFlags.gpuDirectRDMACapable, wsl ? 0 : 1);
    EXPECT_EQ(p.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    std::memset(a, 1, 4 * MiB);
    expanse_stats st{};
    st.struct_size = sizeof st;
    ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
    creates[wsl] = st.driver_calls[static_cast<int>(expanse::driver::EntryPoint::mem_create)];
    must_free(a, 4 * MiB, 0, nullptr);
    stop();
  }
  EXPECT_EQ(creates[1], creates[0]) << "the probe's calls were counted in the stats";
}

// Finding 7: a 12.2 driver (535 series) lacks the newest entry points; an 11.4 one lacks stream
// ids altogether. Both work, and reuse stays safe across a recycled handle.
TEST_P(StreamTruth, OlderDriversWorkAndStaySafe) {
  for (const char* version : {"12020", "11040"}) {
    SCOPED_TRACE(version);
    start(std::string("sim_capacity:1GiB,sim_driver_version:") + version);
    CUstream s1 = stream(0), s3 = stream(0);
    void* a = must_malloc(4 * MiB, 0, s1);
    hold_(s1);
    must_free(a, 4 * MiB, 0, s1);
    destroy(s1);
    CUstream s2 = stream(0);
    void* b = must_malloc(4 * MiB, 0, s2);
    EXPECT_FALSE(overlaps(a, 4 * MiB, b, 4 * MiB));
    void* c = must_malloc(4 * MiB, 0, s3);
    EXPECT_FALSE(overlaps(a, 4 * MiB, c, 4 * MiB));
    must_free(b, 4 * MiB, 0, s2);
    must_free(c, 4 * MiB, 0, s3);
    // Everything comes back once the work is done.
    release_all_();
    void* big = must_malloc(1024 * MiB - 16 * MiB, 0, s3);
    must_free(big, 1024 * MiB - 16 * MiB, 0, s3);
    stop();
  }
}

INSTANTIATE_TEST_SUITE_P(Drivers, StreamTruth, ::testing::Values("sim", "simcuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
