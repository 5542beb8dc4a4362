// Code built with nvcc --default-stream per-thread means each thread's own stream by NULL; nvcc
// then defines CUDA_API_PER_THREAD_DEFAULT_STREAM, and expanse.h passes CU_STREAM_PER_THREAD for
// a NULL stream. This file is built so (as such code is), with no EXPANSE_CONF null_stream key:
// a block thread A freed on NULL while its own stream's work is pending is not thread B's.
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include "expanse/expanse.h"
// The test's own driver calls (the fixture's cuda.h) stay the plain ones it resolves by name.
#undef CUDA_API_PER_THREAD_DEFAULT_STREAM
#include "two_drivers_fixture.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace {

constexpr size_t MiB = size_t{1} << 20;

class NullStreamPtds : public expanse::test::TwoDrivers {};

TEST_P(NullStreamPtds, ABlockFreedOnNullIsNotAnotherThreadsBeforeItsWorkIsDone) {
  start("sim_capacity:1GiB");
  const CUcontext ctx = primary(0);
  void* a = nullptr;
  std::thread ta([&] {
    t().ctx_set_current(ctx);
    a = expanse_malloc(4 * MiB, 0, nullptr);
    hold_(CU_STREAM_PER_THREAD);  // thread A's own stream: its work on a is pending
    EXPECT_EQ(expanse_free_checked(a, 4 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  });
  ta.join();
  void* b = nullptr;
  std::thread tb([&] {
    t().ctx_set_current(ctx);
    b = expanse_malloc(4 * MiB, 0, nullptr);
  });
  tb.join();
  ASSERT_NE(b, nullptr) << expanse_last_error();
  EXPECT_FALSE(expanse::test::overlaps(a, 4 * MiB, b, 4 * MiB))
      << "thread B's NULL got thread A's pending block";
  EXPECT_EQ(expanse_free_checked(b, 4 * MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
}

INSTANTIATE_TEST_SUITE_P(Drivers, NullStreamPtds, ::testing::Values("sim", "simcuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
