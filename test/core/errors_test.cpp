// Bad input gets a clear error naming the pointer or size, and nothing changes.
#include "core_fixture.hpp"
#include "expanse/errors.hpp"

namespace expanse::test {
namespace {

class ErrorsTest : public CoreTest {
 protected:
  void SetUp() override { make(sim_config(2 * GiB)); }

  // Runs f, expects usage_error whose message contains `needle`, and no state change.
  template <class F>
  void expect_rejected(F&& f, const std::string& needle) {
    core::DeviceStats before = alloc_->stats();
    uint64_t calls = work_calls();
    try {
      f();
      ADD_FAILURE() << "no error for bad input (expected one mentioning '" << needle << "')";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    core::DeviceStats after = alloc_->stats();
    EXPECT_EQ(before.allocated_bytes, after.allocated_bytes);
    EXPECT_EQ(before.live_blocks, after.live_blocks);
    EXPECT_EQ(before.mapped_bytes, after.mapped_bytes);
    EXPECT_EQ(before.num_frees, after.num_frees);
    EXPECT_EQ(work_calls(), calls);
    EXPECT_EQ(alloc_->check_invariants(), "");
  }
};

TEST_F(ErrorsTest, ZeroBytesIsNullAndNotAnError) {
  EXPECT_EQ(alloc_->allocate(0, nullptr), nullptr);
  EXPECT_EQ(alloc_->stats().num_allocs, 0u);
}

TEST_F(ErrorsTest, FreeOfNullDoesNothing) {
  uint64_t calls = work_calls();
  alloc_->deallocate(nullptr, nullptr);
  EXPECT_EQ(work_calls(), calls);
  EXPECT_EQ(alloc_->stats().num_frees, 0u);
}

TEST_F(ErrorsTest, DoubleFreeIsRejectedAndNamesThePointer) {
  void* p = alloc_->allocate(1000, nullptr);
  void* q = alloc_->allocate(1000, nullptr);
  fill_pattern(q, 1000, 1);
  alloc_->deallocate(p, nullptr);
  char hex[32];
  std::snprintf(hex, sizeof hex, "%p", p);
  expect_rejected([&] { alloc_->deallocate(p, nullptr); }, hex);
  EXPECT_EQ(check_pattern(q, 1000, 1), SIZE_MAX);
  alloc_->deallocate(q, nullptr);
}

TEST_F(ErrorsTest, InteriorPointerIsRejected) {
  void* p = alloc_->allocate(4096, nullptr);
  expect_rejected([&] { alloc_->deallocate(static_cast<char*>(p) + 512, nullptr); }, "interior");
  alloc_->deallocate(p, nullptr);
}

TEST_F(ErrorsTest, FreeWithAnotherSizeIsRejected) {
  void* p = alloc_->allocate(3000, nullptr);
  expect_rejected([&] { alloc_->deallocate(p, nullptr, 2999); }, "allocated with size 3000");
  alloc_->deallocate(p, nullptr, 3000);
  EXPECT_EQ(alloc_->stats().live_blocks, 0u);
}

TEST_F(ErrorsTest, ForeignPointerIsRejected) {
  int on_stack = 0;
  expect_rejected([&] { alloc_->deallocate(&on_stack, nullptr); }, "not a pointer expanse returned");
}

TEST_F(ErrorsTest, RecordStreamOfForeignPointerIsRejected) {
  int on_stack = 0;
  expect_rejected([&] { alloc_->record_stream(&on_stack, nullptr); }, "record_stream");
}

TEST_F(ErrorsTest, OverflowingSizeIsRejectedAndNamesTheSize) {
  expect_rejected([&] { alloc_->allocate(SIZE_MAX, nullptr); }, std::to_string(SIZE_MAX));
  expect_rejected([&] { alloc_->allocate(SIZE_MAX - 100, nullptr); }, "overflows");
}

TEST_F(ErrorsTest, OutOfMemoryChangesNothingAndLaterRequestsWork) {
  void* p = alloc_->allocate(1 * GiB, nullptr);
  fill_pattern(p, 1 * GiB, 2);
  core::DeviceStats before = alloc_->stats();
  EXPECT_THROW(alloc_->allocate(1 * GiB + 1, nullptr), out_of_memory);
  EXPECT_THROW(alloc_->allocate(100 * GiB, nullptr), std::bad_alloc);
  core::DeviceStats after = alloc_->stats();
  EXPECT_EQ(after.num_ooms, before.num_ooms + 2);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(check_pattern(p, 1 * GiB, 2), SIZE_MAX);
  void* q = alloc_->allocate(1 * GiB, nullptr);
  EXPECT_NE(q, nullptr);
  alloc_->deallocate(q, nullptr);
  alloc_->deallocate(p, nullptr);
}

}  // namespace
}  // namespace expanse::test
