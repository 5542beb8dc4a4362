// expanse::memory_resource against CCCL's cuda::mr concepts (compile time) and through
// cuda::mr's type-erased references on the sim (run time).
#include "expanse/memory_resource.hpp"
#include "simcuda_streams.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using expanse::memory_resource;
namespace mr = ::cuda::mr;

#if CCCL_VERSION < 3001000
// CCCL 3.0 (CUDA 13.0): resource = synchronous, async_resource = stream-ordered.
static_assert(mr::resource<memory_resource>);
static_assert(mr::async_resource<memory_resource>);
static_assert(mr::resource_with<memory_resource, mr::device_accessible>);
static_assert(mr::async_resource_with<memory_resource, mr::device_accessible>);
static_assert(!mr::resource_with<memory_resource, mr::host_accessible>);
static_assert(!mr::async_resource_with<memory_resource, mr::host_accessible>);
using sync_ref = mr::resource_ref<mr::device_accessible>;
using stream_ref_t = mr::async_resource_ref<mr::device_accessible>;
#else
// CCCL 3.1+: synchronous_resource = synchronous, resource = stream-ordered.
static_assert(mr::synchronous_resource<memory_resource>);
static_assert(mr::resource<memory_resource>);
static_assert(mr::synchronous_resource_with<memory_resource, mr::device_accessible>);
static_assert(mr::resource_with<memory_resource, mr::device_accessible>);
static_assert(!mr::resource_with<memory_resource, mr::host_accessible>);
using sync_ref = mr::synchronous_resource_ref<mr::device_accessible>;
using stream_ref_t = mr::resource_ref<mr::device_accessible>;
#endif
static_assert(std::is_nothrow_copy_constructible_v<memory_resource>);
static_assert(std::is_default_constructible_v<memory_resource>);

// The calls differ between CCCL generations; these wrap them so the tests read the same.
#if CCCL_VERSION < 3001000
void* alloc_sync(sync_ref r, size_t n, size_t a) { return r.allocate(n, a); }
void free_sync(sync_ref r, void* p, size_t n, size_t a) { r.deallocate(p, n, a); }
void* alloc_on(stream_ref_t r, CUstream s, size_t n, size_t a) {
  return r.allocate_async(n, a, ::cuda::stream_ref(s));
}
void free_on(stream_ref_t r, CUstream s, void* p, size_t n, size_t a) {
  r.deallocate_async(p, n, a, ::cuda::stream_ref(s));
}
#else
void* alloc_sync(sync_ref r, size_t n, size_t a) { return r.allocate_sync(n, a); }
void free_sync(sync_ref r, void* p, size_t n, size_t a) { r.deallocate_sync(p, n, a); }
void* alloc_on(stream_ref_t r, CUstream s, size_t n, size_t a) {
  return r.allocate(::cuda::stream_ref(s), n, a);
}
void free_on(stream_ref_t r, CUstream s, void* p, size_t n, size_t a) {
  r.deallocate(::cuda::stream_ref(s), p, n, a);
}
#endif

expanse::Stats stats(int device = 0) { return expanse::device_allocator(device).stats(); }

class CcclResourceTest : public ::testing::Test {
 protected:
  void SetUp() override { expanse::init("driver:sim,sim_capacity:1GiB,sim_devices:2"); }
  void TearDown() override { expanse::shutdown(); }
};

TEST_F(CcclResourceTest, SynchronousThroughResourceRef) {
  memory_resource res;
  sync_ref ref{res};
  void* p = alloc_sync(ref, 1 << 20, 256);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 1 << 20);  // sim memory is host memory
  EXPECT_EQ(stats().live_blocks, 1u);
  EXPECT_EQ(stats().requested_bytes, 1u << 20);
  free_sync(ref, p, 1 << 20, 256);
  EXPECT_EQ(stats().live_blocks, 0u);
}

TEST_F(CcclResourceTest, StreamOrderedThroughResourceRef) {
  memory_resource res;
  stream_ref_t ref{res};
  std::vector<void*> ps;
  for (size_t n : {size_t{1}, size_t{4096}, size_t{3} << 20}) {
    ps.push_back(alloc_on(ref, nullptr, n, 256));
    ASSERT_NE(ps.back(), nullptr);
  }
  EXPECT_EQ(stats().live_blocks, 3u);
  free_on(ref, nullptr, ps[0], 1, 256);
  free_on(ref, nullptr, ps[1], 4096, 256);
  free_on(ref, nullptr, ps[2], size_t{3} << 20, 256);
  EXPECT_EQ(stats().live_blocks, 0u);
}

TEST_F(CcclResourceTest, AlignmentUpToMaxIsHonoured) {
  memory_resource res;
  std::vector<void*> ps;
  for (size_t align = 1; align <= memory_resource::max_alignment; align *= 2) {
    for (size_t n : {size_t{1}, size_t{100}, size_t{513}, size_t{70000}}) {
      void* p = alloc_sync(sync_ref{res}, n, align);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << n << " bytes, alignment " << align;
      ps.push_back(p);
    }
  }
  for (void* p : ps) free_sync(sync_ref{res}, p, 0, 1);
  EXPECT_EQ(stats().live_blocks, 0u);
  EXPECT_THROW(alloc_sync(sync_ref{res}, 64, 1024), expanse::usage_error);
  EXPECT_THROW(alloc_sync(sync_ref{res}, 64, 48), expanse::usage_error);
  EXPECT_THROW(alloc_sync(sync_ref{res}, 64, 0), expanse::usage_error);
  EXPECT_EQ(stats().num_allocs, ps.size());
}

TEST_F(CcclResourceTest, EqualityFollowsTheDevice) {
  memory_resource a;
  memory_resource b(0);
  memory_resource c(1);
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a != c);
  EXPECT_EQ(c.device(), 1);
  // Memory from one resource may be freed through an equal one.
  void* p = alloc_sync(sync_ref{a}, 256, 256);
  free_sync(sync_ref{b}, p, 256, 256);
  EXPECT_EQ(stats().live_blocks, 0u);
  p = alloc_sync(sync_ref{c}, 256, 256);
  EXPECT_EQ(stats(1).live_blocks, 1u);
  EXPECT_EQ(stats(0).live_blocks, 0u);
  free_sync(sync_ref{c}, p, 256, 256);
}

TEST_F(CcclResourceTest, OutOfMemoryIsABadAlloc) {
  memory_resource res;
  EXPECT_THROW(alloc_sync(sync_ref{res}, size_t{2} << 30, 256), std::bad_alloc);
  EXPECT_THROW(alloc_on(stream_ref_t{res}, nullptr, size_t{2} << 30, 256), expanse::out_of_memory);
  void* p = alloc_sync(sync_ref{res}, size_t{512} << 20, 256);  // later requests still work
  EXPECT_NE(p, nullptr);
  free_sync(sync_ref{res}, p, 0, 256);
}

// On a real (simulated) stream: stream-ordered frees are honoured across streams.
TEST(CcclResourceStreams, FreedOnABusyStreamIsNotReusedElsewhere) {
  expanse_test::SimCuda sim(EXPANSE_SIMCUDA_PATH);
  ASSERT_TRUE(sim.ok()) << sim.error();
  ASSERT_EQ(sim.configure("sim_capacity:1GiB"), 0);
  CUstream s1 = sim.create_stream();
  CUstream s2 = sim.create_stream();
  ASSERT_NE(s1, nullptr) << sim.error();
  ASSERT_NE(s2, nullptr) << sim.error();
  expanse::init(std::string("driver:cuda,driver_library:") + sim.path());

  memory_resource res;
  stream_ref_t ref{res};
  sim.hold(s1);
  void* p = alloc_on(ref, s1, 1 << 20, 256);
  free_on(ref, s1, p, 1 << 20, 256);
  void* q = alloc_on(ref, s2, 1 << 20, 256);
  EXPECT_NE(q, p);
  free_on(ref, s2, q, 1 << 20, 256);
  sim.release(s1);
  expanse::shutdown();
}

}  // namespace
