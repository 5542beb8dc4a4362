// The allocator's parts (Placement, StreamOrder, PageSupply) on a fresh in-process sim, wired as
// DeviceAllocator wires them but without it, for unit tests of each part. TearDown gives
// everything back as ~DeviceAllocator does and checks the sim holds nothing.
#pragma once

#include "core/device/device_driver.hpp"
#include "core/pages/page_supply.hpp"
#include "core/placement/placement.hpp"
#include "core/streams/stream_order.hpp"
#include "core_fixture.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace expanse::test {

class CorePartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    drv_ = driver::load_sim(sim_config(1 * GiB), "test");
    dd_ = std::make_unique<core::DeviceDriver>(*drv_, 0);
    P = dd_->granularity();
    opts_.page_size = P;
    opts_.va_size = 64 * P;
    opts_.small_va_size = 16 * P;
    opts_.small_max = 1 * MiB;
    opts_.va_budget = 256 * P;
    placement_ = std::make_unique<core::Placement>(*dd_, opts_, P, stats_);
    streams_ = std::make_unique<core::StreamOrder>(*dd_, *placement_, opts_);
    supply_ =
        std::make_unique<core::PageSupply>(*dd_, *placement_, *streams_, stats_, opts_, P);
  }

  void TearDown() override {
    streams_->poll(true);
    placement_->for_each_reservation([&](core::Reservation& r) {
      for (const core::HandleRun& h : r.handles_in(0, r.page_count())) {
        supply_->unmap_handles(r, h.head, h.end());
      }
      dd_->address_free(r.base, r.size);
    });
    supply_->release_pool_quietly();
    streams_->destroy_events();
    supply_.reset();
    streams_.reset();
    placement_.reset();
    dd_.reset();
    for (CUstream s : made_) drv_->table().stream_destroy(s);
    sim::Outstanding o = sim::outstanding();
    EXPECT_EQ(o.reservations, 0u) << sim::describe_outstanding();
    EXPECT_EQ(o.allocations, 0u) << sim::describe_outstanding();
    EXPECT_EQ(o.mappings, 0u) << sim::describe_outstanding();
    drv_.reset();
  }

  // A new stream on device 0 (in its primary context).
  CUstream new_stream() {
    const auto& t = drv_->table();
    CUcontext ctx = dd_->primary();
    EXPECT_EQ(t.ctx_push_current(ctx), CUDA_SUCCESS);
    CUstream s = nullptr;
    EXPECT_EQ(t.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    t.ctx_pop_current(&popped);
    made_.push_back(s);
    return s;
  }

  // [offset, offset+bytes) of reservation r carved out of the free block around it, live (not
  // touched: the caller touches what it means to be a live block's pages).
  core::BlockIt carve(const core::Reservation& r, size_t offset, size_t bytes) {
    core::BlockIndex& index = placement_->index();
    auto c = index.blocks().upper_bound(r.base + offset);
    --c;
    core::BlockIt it =
        index.carve(c, bytes, r.arena, static_cast<size_t>(r.base + offset - c->first));
    it->second.state = core::BlockState::live;
    return it;
  }

  size_t P = 0;
  std::unique_ptr<driver::LoadedDriver> drv_;
  std::unique_ptr<core::DeviceDriver> dd_;
  core::AllocatorOptions opts_;
  core::DeviceStats stats_;
  std::unique_ptr<core::Placement> placement_;
  std::unique_ptr<core::StreamOrder> streams_;
  std::unique_ptr<core::PageSupply> supply_;
  std::vector<CUstream> made_;
};

}  // namespace expanse::test
