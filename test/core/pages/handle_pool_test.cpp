// The pool of unmapped handles on its own (handle_pool.hpp).
#include "core/pages/handle_pool.hpp"

#include <gtest/gtest.h>

namespace expanse::test {
namespace {

TEST(HandlePoolTest, HandlesComeBackBySizeLastPutFirst) {
  core::HandlePool pool;
  EXPECT_TRUE(pool.empty());
  pool.put(4, 41);
  pool.put(1, 11);
  pool.put(4, 42);
  EXPECT_EQ(pool.pages(), 9u);
  EXPECT_TRUE(pool.has(4));
  EXPECT_FALSE(pool.has(2));
  EXPECT_EQ(pool.smallest(), 1u);
  EXPECT_EQ(pool.largest(), 4u);
  EXPECT_EQ(pool.peek(4), 42u);
  EXPECT_EQ(pool.take(4), 42u);
  EXPECT_EQ(pool.take(4), 41u);
  EXPECT_FALSE(pool.has(4));
  EXPECT_EQ(pool.largest(), 1u) << "no empty size left behind";
  EXPECT_EQ(pool.pages(), 1u);
  EXPECT_EQ(pool.take(1), 11u);
  EXPECT_TRUE(pool.empty());
}

TEST(HandlePoolTest, LargestBelowIsTheLargestSmallerSize) {
  core::HandlePool pool;
  pool.put(2, 1);
  pool.put(8, 2);
  EXPECT_EQ(pool.largest_below(2), 0u);
  EXPECT_EQ(pool.largest_below(3), 2u);
  EXPECT_EQ(pool.largest_below(8), 2u);
  EXPECT_EQ(pool.largest_below(100), 8u);
  size_t n = 0, pages = 0;
  pool.for_each([&](size_t p, CUmemGenericAllocationHandle) {
    ++n;
    pages += p;
  });
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(pages, 10u);
}

}  // namespace
}  // namespace expanse::test
