// Thrust on expanse memory, compiled by the host compiler with THRUST_DEVICE_SYSTEM_CPP: the
// "device" algorithms run on host threads over pointers expanse returns, which the sim backs with
// host memory. The allocator code is the same that nvcc compiles for the CUDA backend
// (thrust_cuda_test.cu).
#include "expanse/thrust.hpp"
#include "simcuda_streams.hpp"

#include <thrust/copy.h>
#include <thrust/functional.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/system/cpp/execution_policy.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CPP
#error "this test is built with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP"
#endif

namespace {

using expanse::thrust_allocator;

// The allocator's pointer is a device_ptr, so vector iterators are device-system iterators.
// (Under the CPP backend the device system tag is the host's, so only the nvcc test can tell a
// raw-pointer allocator apart; this checks the types themselves.)
static_assert(std::is_same_v<thrust_allocator<int>::pointer, thrust::device_ptr<int>>);
static_assert(std::is_same_v<expanse::device_vector<float>::pointer, thrust::device_ptr<float>>);
static_assert(std::is_same_v<thrust::iterator_system<expanse::device_vector<int>::iterator>::type,
                             thrust::device_system_tag>);
static_assert(std::is_same_v<thrust_allocator<int>::rebind<double>::other, thrust_allocator<double>>);
static_assert(std::is_same_v<expanse::thrust_temporary_allocator::value_type, char>);

class ThrustCppTest : public ::testing::Test {
 protected:
  void SetUp() override { expanse::init("driver:sim,sim_capacity:1GiB,sim_devices:2"); }
  void TearDown() override { expanse::shutdown(); }

  static expanse::Stats stats(int device = 0) { return expanse::device_allocator(device).stats(); }
};

TEST_F(ThrustCppTest, VectorMemoryComesFromExpanse) {
  {
    expanse::device_vector<int> v(1000, 7);
    auto s = stats();
    EXPECT_EQ(s.live_blocks, 1u);
    EXPECT_EQ(s.requested_bytes, 1000 * sizeof(int));
    EXPECT_EQ(thrust::reduce(v.begin(), v.end()), 7000);
    // The vector's storage is a block expanse handed out: record_stream accepts it.
    EXPECT_NO_THROW(expanse::record_stream(thrust::raw_pointer_cast(v.data()), nullptr));
  }
  EXPECT_EQ(stats().live_blocks, 0u);
  EXPECT_EQ(stats().num_frees, stats().num_allocs);
}

TEST_F(ThrustCppTest, VectorGrowsAndShrinks) {
  expanse::device_vector<std::uint32_t> v;
  std::vector<size_t> capacities;
  for (std::uint32_t i = 0; i < 20000; ++i) {
    v.push_back(i * 3u);
    if (capacities.empty() || capacities.back() != v.capacity()) capacities.push_back(v.capacity());
  }
  EXPECT_GE(capacities.size(), 5u);  // it reallocated as it grew
  EXPECT_EQ(stats().live_blocks, 1u);  // and gave each old buffer back
  EXPECT_GE(stats().num_allocs, capacities.size());

  v.resize(1 << 20);  // 4 MiB: several 2 MiB pages
  EXPECT_EQ(stats().requested_bytes, v.capacity() * sizeof(std::uint32_t));
  std::vector<std::uint32_t> head(20000);
  thrust::copy(v.begin(), v.begin() + 20000, head.begin());
  for (std::uint32_t i = 0; i < 20000; ++i) ASSERT_EQ(head[i], i * 3u) << "at " << i;

  v.resize(100);
  v.shrink_to_fit();
  EXPECT_EQ(v.capacity(), 100u);
  EXPECT_EQ(stats().requested_bytes, 100 * sizeof(std::uint32_t));
  EXPECT_EQ(v[99], 297u);

  v.clear();
  v.shrink_to_fit();
  EXPECT_EQ(stats().live_blocks, 0u);
  EXPECT_EQ(stats().requested_bytes, 0u);
}

TEST_F(ThrustCppTest, SortAndReduceTakeTemporaryStorageFromExpanse) {
  std::mt19937 rng(12345);
  std::vector<std::int64_t> host(200000);
  for (auto& x : host) x = static_cast<std::int64_t>(rng() % 1000000) - 500000;

  expanse::device_vector<std::int64_t> v(host.begin(), host.end());
  const auto before = stats();
  ASSERT_EQ(before.live_blocks, 1u);

  thrust::sort(expanse::thrust_exec_policy(), v.begin(), v.end());
  const auto after = stats();
  EXPECT_GT(after.num_allocs, before.num_allocs) << "the sort took no temporary storage from expanse";
  EXPECT_EQ(after.live_blocks, 1u) << "temporary storage was not given back";

  std::vector<std::int64_t> sorted(v.size());
  thrust::copy(v.begin(), v.end(), sorted.begin());
  std::sort(host.begin(), host.end());
  EXPECT_EQ(sorted, host);

  const std::int64_t sum = thrust::reduce(expanse::thrust_exec_policy(), v.begin(), v.end(),
                                          std::int64_t{0});
  EXPECT_EQ(sum, std::accumulate(host.begin(), host.end(), std::int64_t{0}));
  const std::int64_t max = thrust::reduce(expanse::thrust_exec_policy(), v.begin(), v.end(),
                                          host.front(), thrust::maximum<std::int64_t>());
  EXPECT_EQ(max, host.back());
  EXPECT_EQ(stats().live_blocks, 1u);
}

TEST_F(ThrustCppTest, SortByKeyDescending) {
  const int n = 50000;
  expanse::device_vector<int> keys(n);
  expanse::device_vector<int> values(n);
  thrust::sequence(keys.begin(), keys.end());
  thrust::sequence(values.begin(), values.end(), 0, 2);
  const auto before = stats().num_allocs;
  thrust::sort_by_key(expanse::thrust_exec_policy(), keys.begin(), keys.end(), values.begin(),
                      thrust::greater<int>());
  EXPECT_GT(stats().num_allocs, before);
  for (int i : {0, 1, n / 2, n - 1}) {
    EXPECT_EQ(keys[static_cast<size_t>(i)], n - 1 - i);
    EXPECT_EQ(values[static_cast<size_t>(i)], 2 * (n - 1 - i));
  }
}

// The explicit forms the header's helper stands for: par(alloc) over an allocator the caller
// keeps (held by reference) or passes by value.
TEST_F(ThrustCppTest, ExplicitPolicyForms) {
  expanse::device_vector<int> v(30000);
  thrust::sequence(v.begin(), v.end(), 30000, -1);

  expanse::thrust_temporary_allocator temp;  // device 0, default stream
  auto n0 = stats().num_allocs;
  thrust::sort(thrust::cpp::par(temp), v.begin(), v.end());
  EXPECT_GT(stats().num_allocs, n0);
  EXPECT_EQ(v[0], 1);

  n0 = stats().num_allocs;
  thrust::sort(thrust::device(expanse::thrust_temporary_allocator(0, nullptr)), v.begin(), v.end(),
               thrust::greater<int>());
  EXPECT_GT(stats().num_allocs, n0);
  EXPECT_EQ(v[0], 30000);
  EXPECT_EQ(stats().live_blocks, 1u);
}

TEST_F(ThrustCppTest, AllocatesOnTheChosenDevice) {
  expanse::device_vector<double> on1(4096, 1.5, thrust_allocator<double>(1));
  EXPECT_EQ(stats(1).live_blocks, 1u);
  EXPECT_EQ(stats(0).live_blocks, 0u);
  EXPECT_EQ(on1.get_allocator().device(), 1);
  // Temporary storage on device 1 as well.
  const auto before = stats(1).num_allocs;
  thrust::sort(expanse::thrust_exec_policy(nullptr, 1), on1.begin(), on1.end());
  EXPECT_GT(stats(1).num_allocs, before);
  EXPECT_EQ(stats(0).num_allocs, 0u);
  EXPECT_DOUBLE_EQ(thrust::reduce(on1.begin(), on1.end()), 1.5 * 4096);

  // Copies keep the allocator (and so the device).
  expanse::device_vector<double> copy = on1;
  EXPECT_EQ(copy.get_allocator().device(), 1);
  EXPECT_EQ(stats(1).live_blocks, 2u);
}

TEST_F(ThrustCppTest, AllocatorEqualityAndRebind) {
  thrust_allocator<int> a0;
  thrust_allocator<int> a1(1);
  thrust_allocator<double> b0(0, nullptr);
  thrust_allocator<char> c1(a1);  // rebinding copy keeps device and stream
  EXPECT_TRUE(a0 == b0);
  EXPECT_TRUE(a0 != a1);
  EXPECT_EQ(c1.device(), 1);
  EXPECT_EQ(c1.stream(), nullptr);
  EXPECT_EQ(a0.allocate(0).get(), nullptr);
  EXPECT_THROW(a0.allocate(a0.max_size() + 1), std::bad_alloc);
  EXPECT_THROW(a0.allocate((size_t{2} << 30) / sizeof(int)), expanse::out_of_memory);
  // A vector bigger than the device fails cleanly and leaves nothing behind.
  EXPECT_THROW(expanse::device_vector<int>((size_t{2} << 30) / sizeof(int)), std::bad_alloc);
  EXPECT_EQ(stats().live_blocks, 0u);
}

// With real (simulated) streams: the allocator orders its memory on its stream. Memory a vector
// on a held stream gave back is not handed to a vector on another stream while that work may
// still be pending.
TEST(ThrustStreams, AllocatorOrdersOnItsStream) {
  expanse_test::SimCuda sim(EXPANSE_SIMCUDA_PATH);
  ASSERT_TRUE(sim.ok()) << sim.error();
  ASSERT_EQ(sim.configure("sim_capacity:1GiB"), 0);
  CUstream s1 = sim.create_stream();
  CUstream s2 = sim.create_stream();
  ASSERT_NE(s1, nullptr) << sim.error();
  ASSERT_NE(s2, nullptr) << sim.error();
  expanse::init(std::string("driver:cuda,driver_library:") + sim.path());

  const thrust_allocator<int> on_s1(0, s1);
  const thrust_allocator<int> on_s2(0, s2);
  int* first = nullptr;
  sim.hold(s1);  // s1's work stays pending
  {
    expanse::device_vector<int> v(1 << 16, 1, on_s1);
    first = thrust::raw_pointer_cast(v.data());
    thrust::sort(expanse::thrust_exec_policy(s1), v.begin(), v.end());
  }  // freed on s1
  {
    expanse::device_vector<int> w(1 << 16, 2, on_s2);
    EXPECT_NE(thrust::raw_pointer_cast(w.data()), first)
        << "memory freed on a busy stream was handed to another stream";
    EXPECT_EQ(thrust::reduce(w.begin(), w.end()), 2 << 16);
  }
  sim.release(s1);
  expanse::shutdown();
}

}  // namespace
