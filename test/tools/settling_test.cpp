// What a settled step may do (report/settling.hpp): each rule broken alone is named, with its
// count, and a step that only grows past its earlier peak keeps the promise.
#include "report/settling.hpp"

#include <gtest/gtest.h>

namespace expanse::test {
namespace {

using driver::EntryPoint;

constexpr uint64_t P = uint64_t{2} << 20;

uint64_t& calls(replay::StepCalls& s, EntryPoint e) { return s.calls[static_cast<size_t>(e)]; }

// A step that maps 10 new pages above its earlier peak, each created, mapped and granted once.
replay::StepCalls growth() {
  replay::StepCalls s;
  calls(s, EntryPoint::mem_create) = 10;
  calls(s, EntryPoint::mem_map) = 10;
  calls(s, EntryPoint::mem_set_access) = 3;
  s.created_pages = 10;
  s.peak_physical_before = 100 * P;
  s.peak_physical_after = 110 * P;
  return s;
}

TEST(SettledStep, GrowthAboveTheEarlierPeakKeepsThePromise) {
  EXPECT_EQ(replay::settled_step_breaks(replay::StepCalls{}, P), "");
  EXPECT_EQ(replay::settled_step_breaks(growth(), P), "");
}

TEST(SettledStep, EachBrokenRuleIsNamedWithItsCount) {
  replay::StepCalls s = growth();
  calls(s, EntryPoint::mem_unmap) = 2;
  EXPECT_EQ(replay::settled_step_breaks(s, P), "2 cuMemUnmap");

  s = growth();
  calls(s, EntryPoint::mem_release) = 1;
  EXPECT_EQ(replay::settled_step_breaks(s, P), "1 cuMemRelease");

  s = growth();
  s.created_pages = 12;  // two pages made again below the peak
  EXPECT_EQ(replay::settled_step_breaks(s, P), "12 pages created, 10 above the earlier peak");

  s = growth();
  s.peak_physical_after = s.peak_physical_before;  // no growth: nothing may be created
  EXPECT_EQ(replay::settled_step_breaks(s, P), "10 pages created, 0 above the earlier peak");

  s = growth();
  calls(s, EntryPoint::mem_map) = 11;  // a pooled handle mapped again
  EXPECT_EQ(replay::settled_step_breaks(s, P), "11 cuMemMap for 10 handles created");

  s = growth();
  calls(s, EntryPoint::mem_set_access) = 11;
  EXPECT_EQ(replay::settled_step_breaks(s, P), "11 cuMemSetAccess for 10 mappings");

  s = growth();
  calls(s, EntryPoint::event_record) = 1;
  calls(s, EntryPoint::ctx_get_current) = 3;
  EXPECT_EQ(replay::settled_step_breaks(s, P),
            "3 cuCtxGetCurrent (the model: 0); 1 cuEventRecord (the model: 0)");
}

// Calls the model of expandable segments makes in the same step are allowed up to its count;
// synchronizations of any kind count against its cuStreamSynchronize.
TEST(SettledStep, OtherCallsUpToTheModels) {
  replay::StepCalls s = growth();
  calls(s, EntryPoint::mem_address_reserve) = 1;
  calls(s, EntryPoint::event_synchronize) = 1;
  calls(s, EntryPoint::stream_synchronize) = 1;
  s.model_calls["cuMemAddressReserve"] = 1;
  s.model_calls["cuStreamSynchronize"] = 2;
  EXPECT_EQ(replay::settled_step_breaks(s, P), "");
  s.model_calls["cuStreamSynchronize"] = 1;
  EXPECT_EQ(replay::settled_step_breaks(s, P), "2 synchronizations (the model: 1)");
  calls(s, EntryPoint::mem_address_reserve) = 2;
  EXPECT_EQ(replay::settled_step_breaks(s, P),
            "2 cuMemAddressReserve (the model: 1); 2 synchronizations (the model: 1)");
}

TEST(SettlingBounds, ByKindOfWorkload) {
  // Varying: 1.25 x the model, or the one-page floor where that is larger, + 10 ms.
  EXPECT_DOUBLE_EQ(replay::varying_driver_bound(0.1, 0.9), 0.91);
  EXPECT_DOUBLE_EQ(replay::varying_driver_bound(0.1, 0.05), 0.135);
  // Repeats: 1.25 x the larger of the model and the live-set floor, + 10 ms.
  EXPECT_DOUBLE_EQ(replay::repeated_driver_bound(0.034, 0.086), 1.25 * 0.086 + 0.01);
  EXPECT_DOUBLE_EQ(replay::repeated_driver_bound(0.264, 0.104), 1.25 * 0.264 + 0.01);
}

// Steps between marks: the first from nothing, each later one the difference.
TEST(SettledStep, StepsBetweenMarks) {
  std::vector<replay::ReplayMark> x(2);
  std::vector<replay::TorchMark> m(2);
  x[0].driver_calls[static_cast<size_t>(EntryPoint::mem_create)] = 5;
  x[0].created_pages = 5;
  x[0].peak_physical_bytes = 5 * P;
  x[1].driver_calls[static_cast<size_t>(EntryPoint::mem_create)] = 7;
  x[1].created_pages = 9;
  x[1].peak_physical_bytes = 9 * P;
  m[0].driver_calls["cuMemMap"] = 4;
  m[1].driver_calls["cuMemMap"] = 4;
  m[1].driver_calls["cuStreamSynchronize"] = 1;
  const auto steps = replay::steps_between_marks(x, m);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].calls[static_cast<size_t>(EntryPoint::mem_create)], 5u);
  EXPECT_EQ(steps[1].calls[static_cast<size_t>(EntryPoint::mem_create)], 2u);
  EXPECT_EQ(steps[1].created_pages, 4u);
  EXPECT_EQ(steps[1].peak_physical_before, 5 * P);
  EXPECT_EQ(steps[1].peak_physical_after, 9 * P);
  EXPECT_EQ(steps[0].model_calls.at("cuMemMap"), 4u);
  EXPECT_EQ(steps[1].model_calls.count("cuMemMap"), 0u);
  EXPECT_EQ(steps[1].model_calls.at("cuStreamSynchronize"), 1u);
}

}  // namespace
}  // namespace expanse::test
