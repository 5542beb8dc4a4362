// A GPU running behind its host (SimConfig::gpu_lag, EXPANSE_CONF sim_gpu_lag): work issued at
// host clock t completes once advance_host_clock has brought the clock to t + gpu_lag, in
// stream order, after what it waits for, and not while its stream is held. Queries follow that
// clock; synchronizing completes the work at once and leaves the clock alone. With lag 0 work
// completes when issued, as before the clock existed.
#include <cstring>
#include <stdexcept>
#include <string>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

constexpr uint64_t kLag = 10;

class SimGpuLag : public SimTest {
 protected:
  SimConfig config() const override {
    SimConfig c = SimTest::config();
    c.gpu_lag = kLag;
    return c;
  }
  void SetUp() override {
    SimTest::SetUp();
    make_current(0);
  }
  CUstream stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
    CUstream s = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().stream_create(&s, flags));
    return s;
  }
  CUevent recorded(CUstream s) {
    CUevent e = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().event_create(&e, CU_EVENT_DISABLE_TIMING));
    EXPECT_EQ(CUDA_SUCCESS, t().event_record(e, s));
    return e;
  }
};

TEST_F(SimGpuLag, TheClockStartsAtZeroAndMovesOnlyWhenAdvanced) {
  EXPECT_EQ(host_clock(), 0u);
  const CUevent e = recorded(stream());
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e));
  EXPECT_EQ(host_clock(), 0u) << "a call moved the clock";
  advance_host_clock(3);
  advance_host_clock(4);
  EXPECT_EQ(host_clock(), 7u);
  reset(config());
  EXPECT_EQ(host_clock(), 0u) << "reset kept the clock";
}

// An event recorded after work is not complete until the clock has advanced by the lag, to the
// tick: a fence that passes early would free memory the GPU still uses.
TEST_F(SimGpuLag, AnEventCompletesExactlyTheLagAfterItWasRecorded) {
  for (CUstream s : {stream(), static_cast<CUstream>(nullptr), CU_STREAM_LEGACY,
                     CU_STREAM_PER_THREAD}) {
    SCOPED_TRACE(reinterpret_cast<uintptr_t>(s));
    const uint64_t issued = host_clock();
    const CUevent e = recorded(s);
    EXPECT_EQ(1u, pending_events());
    advance_host_clock(kLag - 1);
    EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e)) << "complete before the lag ran out";
    EXPECT_EQ(CUDA_ERROR_NOT_READY, t().stream_query(s));
    advance_host_clock(1);
    EXPECT_EQ(host_clock(), issued + kLag);
    EXPECT_EQ(CUDA_SUCCESS, t().event_query(e)) << "not complete once the lag ran out";
    EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
    EXPECT_EQ(0u, pending_events());
    EXPECT_EQ(CUDA_SUCCESS, t().event_destroy(e));
  }
}

// Each item is due its own lag after it was issued: a later one stays pending after an earlier
// one completed, and none completes before the one before it on its stream.
TEST_F(SimGpuLag, ItemsAreDueInTheOrderIssued) {
  const CUstream s = stream();
  const CUevent first = recorded(s);
  advance_host_clock(4);
  const CUevent second = recorded(s);
  advance_host_clock(kLag - 4);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(first));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(second));
  advance_host_clock(4);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(second));
}

// A held stream's work stays pending past its due tick, and completes on release once due.
TEST_F(SimGpuLag, AHoldOutlastsTheLagAndAReleaseDoesNotCutIt) {
  const CUstream s = stream();
  hold_stream(s);
  const CUevent e = recorded(s);
  advance_host_clock(kLag * 3);
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e));
  release_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));

  const CUevent early = recorded(s);
  hold_stream(s);
  release_stream(s);
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(early)) << "the release skipped the lag";
  advance_host_clock(kLag);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(early));
}

// Work that waits for another stream's event completes only after that event, even when its own
// due tick came first.
TEST_F(SimGpuLag, AWaitFollowsTheEventItWaitsFor) {
  const CUstream a = stream(), b = stream();
  hold_stream(a);
  const CUevent on_a = recorded(a);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_wait_event(b, on_a, 0));
  const CUevent on_b = recorded(b);
  advance_host_clock(kLag);
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(on_b)) << "ran ahead of the event it waits for";
  release_stream(a);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(on_a));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(on_b));
}

// Synchronizing waits for the work, so it completes it whatever the clock says, and leaves the
// clock where it was; work issued after it is due a full lag later again.
TEST_F(SimGpuLag, SynchronizeCompletesTheWorkAndLeavesTheClock) {
  const CUstream s = stream();
  const CUevent e1 = recorded(s);
  ASSERT_EQ(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e1));
  EXPECT_EQ(host_clock(), 0u);

  const CUevent e2 = recorded(s);
  ASSERT_EQ(CUDA_SUCCESS, t().event_synchronize(e2));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));

  const CUevent e3 = recorded(s);
  const CUevent e4 = recorded(nullptr);
  ASSERT_EQ(CUDA_SUCCESS, t().ctx_synchronize());
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e3));
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e4));
  EXPECT_EQ(host_clock(), 0u) << "a synchronize moved the clock";

  const CUevent e5 = recorded(s);
  advance_host_clock(kLag - 1);
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(e5)) << "work after a sync is due early";
  advance_host_clock(1);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e5));
}

// An asynchronous copy's bytes move when the lagging GPU reaches it, not at the call.
TEST_F(SimGpuLag, AnAsyncMemsetLandsWhenDue) {
  const Buffer buf = make_buffer(gran_);
  auto* dev = as_ptr<unsigned char>(buf.va);
  std::memset(dev, 0, 64);
  const CUstream s = stream();
  ASSERT_EQ(CUDA_SUCCESS, t().memset_d8_async(buf.va, 0x5A, 64, s));
  advance_host_clock(kLag - 1);
  EXPECT_EQ(dev[0], 0) << "the memset ran before the GPU reached it";
  advance_host_clock(1);
  EXPECT_EQ(dev[0], 0x5A);
  EXPECT_EQ(dev[63], 0x5A);
}

class SimNoLag : public SimGpuLag {
 protected:
  SimConfig config() const override { return SimTest::config(); }
};

// Lag 0 (the default): work completes when issued, and advancing the clock changes nothing.
TEST_F(SimNoLag, WorkCompletesWhenIssued) {
  EXPECT_EQ(SimConfig{}.gpu_lag, 0u);
  const CUstream s = stream();
  const CUevent e = recorded(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(e));
  EXPECT_EQ(CUDA_SUCCESS, t().stream_query(s));
  EXPECT_EQ(0u, pending_events());
  hold_stream(s);
  const CUevent held = recorded(s);
  advance_host_clock(1000);
  EXPECT_EQ(CUDA_ERROR_NOT_READY, t().event_query(held));
  release_stream(s);
  EXPECT_EQ(CUDA_SUCCESS, t().event_query(held));
}

TEST(SimGpuLagConf, TheKeyIsParsedAndBadValuesNamed) {
  EXPECT_EQ(sim_config_from_string("sim_gpu_lag:300").gpu_lag, 300u);
  EXPECT_EQ(sim_config_from_string("sim_capacity:1GiB").gpu_lag, 0u);
  for (const char* bad : {"sim_gpu_lag:-1", "sim_gpu_lag:soon", "sim_gpu_lag:"}) {
    SCOPED_TRACE(bad);
    try {
      sim_config_from_string(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("sim_gpu_lag"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace expanse::sim::testing
