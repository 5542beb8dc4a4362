// The C++ pools: expanse::pool (RAII over create/release), pool_scope (thread routing) and
// capture_scope (capture routing), with exceptions instead of codes.
#include "expanse/expanse.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>

namespace {

constexpr size_t MiB = size_t{1} << 20;

class CppPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { expanse::init("driver:sim,sim_capacity:1GiB"); }
  void TearDown() override { expanse::shutdown(); }
};

TEST_F(CppPoolTest, PoolIsRaiiAndMovable) {
  expanse_pool_id id = 0;
  {
    expanse::pool p(0);
    id = p.id();
    EXPECT_NE(id, 0u);
    EXPECT_EQ(p.device(), 0);
    void* a = p.allocate(3 * MiB);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(p.stats().live_blocks, 1u);
    EXPECT_EQ(p.stats().use_count, 1);
    expanse::pool q(std::move(p));
    EXPECT_EQ(p.id(), 0u);
    EXPECT_EQ(q.id(), id);
    EXPECT_THROW(p.allocate(MiB), expanse::usage_error);
    expanse::deallocate(a);
    EXPECT_EQ(q.stats().cached_bytes, 4 * MiB);  // the pool took whole 2 MiB pages
  }
  // Released by the destructor.
  expanse_pool_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_pool_get_stats(id, &s), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(s.released, 1u);
  EXPECT_EQ(expanse_pool_retain(id), EXPANSE_EINVAL);
}

TEST_F(CppPoolTest, ErrorsAreExceptionsNamingTheId) {
  expanse::pool p(0);
  const std::string id = std::to_string(p.id());
  p.release();
  EXPECT_EQ(p.id(), 0u);
  EXPECT_THROW(expanse::pool(7), expanse::usage_error);  // no device 7
  expanse::pool r(0);
  const expanse_pool_id rid = r.id();
  ASSERT_EQ(expanse_pool_release(rid), EXPANSE_OK);  // its use is gone behind its back
  try {
    expanse::pool_scope scope(r);
    FAIL() << "began routing to a released pool";
  } catch (const expanse::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("pool " + std::to_string(rid)), std::string::npos)
        << e.what();
  }
  // r's destructor releases again and fails quietly.
}

TEST_F(CppPoolTest, PoolScopeRoutesTheThread) {
  expanse::pool p(0);
  void* in = nullptr;
  void* out_of_thread = nullptr;
  {
    expanse::pool_scope scope(p);
    in = expanse::allocate(2 * MiB);
    std::thread([&] { out_of_thread = expanse::allocate(2 * MiB); }).join();
    EXPECT_EQ(p.stats().live_blocks, 1u);
  }
  void* after = expanse::allocate(2 * MiB);
  EXPECT_EQ(p.stats().live_blocks, 1u);
  {
    expanse::pool q(0);
    expanse::pool_scope outer(p);
    {
      expanse::pool_scope inner(q);
      void* x = expanse::allocate(MiB);
      EXPECT_EQ(q.stats().live_blocks, 1u) << "the newest scope wins";
      expanse::deallocate(x);
    }
    void* y = expanse::allocate(MiB);
    EXPECT_EQ(p.stats().live_blocks, 2u);
    expanse::deallocate(y);
  }
  for (void* x : {in, out_of_thread, after}) expanse::deallocate(x);
}

TEST_F(CppPoolTest, CaptureScopeAnnouncesAndEnds) {
  expanse::pool p(0);
  // The NULL stream needs a current context to name the capture's: none here, so it throws and
  // leaves no route behind.
  std::thread([&] {
    EXPECT_THROW(expanse::capture_scope(p, nullptr), expanse::driver_failure);
  }).join();
  EXPECT_EQ(expanse_pool_end(p.id()), EXPANSE_EINVAL);
}

}  // namespace
