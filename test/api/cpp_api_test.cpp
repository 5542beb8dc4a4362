// The C++ facade: exceptions instead of codes.
#include "expanse/expanse.hpp"

#include <gtest/gtest.h>

namespace {

constexpr size_t GiB = size_t{1} << 30;

class CppApiTest : public ::testing::Test {
 protected:
  void SetUp() override { expanse::init("driver:sim,sim_capacity:2GiB"); }
  void TearDown() override { expanse::shutdown(); }
};

TEST_F(CppApiTest, AllocateDeallocate) {
  expanse::device_allocator a(0);
  void* p = a.allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.stats().requested_bytes, 1000u);
  EXPECT_GE(a.stats().driver_calls_by_name().at("cuMemMap"), 1u);
  a.deallocate(p);
  EXPECT_EQ(a.stats().live_blocks, 0u);
}

TEST_F(CppApiTest, OutOfMemoryIsABadAlloc) {
  expanse::device_allocator a(0);
  EXPECT_THROW(a.allocate(3 * GiB), std::bad_alloc);
  try {
    a.allocate(3 * GiB);
  } catch (const expanse::out_of_memory& e) {
    EXPECT_EQ(e.requested(), 3 * GiB);
    EXPECT_EQ(e.device(), 0);
  }
}

TEST_F(CppApiTest, BadPointerIsAUsageError) {
  int x = 0;
  EXPECT_THROW(expanse::deallocate(&x, 0), expanse::usage_error);
  EXPECT_THROW(expanse::device_allocator(5), expanse::usage_error);
  expanse::deallocate(nullptr, 0);  // fine
}

TEST_F(CppApiTest, DriverDescription) {
  EXPECT_EQ(expanse::driver_description().rfind("sim:", 0), 0u);
  EXPECT_EQ(expanse::device_count(), 1);
}

}  // namespace

namespace {

// Pinned host memory from C++: exact blocks, errors as exceptions naming the pointer.
TEST(CppHostApiTest, HostAllocateIsExactAndMisuseThrows) {
  expanse::init("driver:sim,sim_capacity:1GiB,sim_host_capacity:256MiB");
  void* p = expanse::host_allocate(5 * (size_t{1} << 20) + 1);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[5 << 20] = 1;
  expanse::host_stats_t s = expanse::host_stats();
  EXPECT_EQ(s.pinned_bytes, size_t{6} << 20);
  EXPECT_EQ(s.path, 1u);
  EXPECT_THROW(expanse::host_deallocate(static_cast<char*>(p) + 64), expanse::usage_error);
  int local = 0;
  EXPECT_THROW(expanse::host_record_stream(&local, nullptr), expanse::usage_error);
  EXPECT_THROW(expanse::host_allocate(0), expanse::usage_error);
  expanse::host_deallocate(p);
  // A tensor's deleter frees after the device; releasing the cache proves it.
  void* q = expanse::host_allocate(size_t{3} << 20);
  EXPECT_THROW(expanse::host_deallocate_after_device(q, 9), expanse::usage_error);
  expanse::host_deallocate_after_device(q);
  EXPECT_EQ(expanse::host_stats().pending_blocks, 1u);
  EXPECT_THROW(expanse::host_deallocate_after_device(q), expanse::usage_error);
  expanse::host_release_cached();
  EXPECT_EQ(expanse::host_stats().pinned_bytes, 0u);
  expanse::shutdown();
}

}  // namespace
