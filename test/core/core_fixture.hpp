// A DeviceAllocator on a fresh in-process sim, plus helpers to make streams and to write and
// check data patterns through the pointers it returns.
#pragma once

#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "sim/sim.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace expanse::test {

inline constexpr size_t KiB = size_t{1} << 10;
inline constexpr size_t MiB = size_t{1} << 20;
inline constexpr size_t GiB = size_t{1} << 30;

inline sim::SimConfig sim_config(size_t capacity, bool backing = true, int devices = 1) {
  sim::SimConfig c;
  c.capacity = capacity;
  c.backing = backing;
  c.devices = devices;
  return c;
}

// Calls that do work: every sim call but the read-only stream lookups the allocator makes about
// once per allocate and free (cuStreamGetId and friends; DeviceStats::stream_queries), and the
// context switches around them (NULL with no current context means the primary context's).
inline uint64_t work_calls() {
  using driver::EntryPoint;
  uint64_t n = sim::total_calls();
  for (EntryPoint e : {EntryPoint::stream_get_id, EntryPoint::stream_get_ctx,
                       EntryPoint::stream_is_capturing,
                       EntryPoint::thread_exchange_stream_capture_mode,
                       EntryPoint::ctx_get_current, EntryPoint::ctx_push_current,
                       EntryPoint::ctx_pop_current}) {
    n -= sim::call_count(e);
  }
  return n;
}

// The entry points splitting a free handle calls (unmap, release, create, map, set access):
// failure tests inject a failure into each in turn, and name each instance after it.
inline std::vector<driver::EntryPoint> split_entry_points() {
  return {driver::EntryPoint::mem_unmap, driver::EntryPoint::mem_release,
          driver::EntryPoint::mem_create, driver::EntryPoint::mem_map,
          driver::EntryPoint::mem_set_access};
}
inline std::string entry_point_param_name(const ::testing::TestParamInfo<driver::EntryPoint>& p) {
  return driver::entry_point_name(p.param);
}

class CoreTest : public ::testing::Test {
 protected:
  void make(const sim::SimConfig& cfg, const core::AllocatorOptions& opts = {}) {
    alloc_.reset();
    drv_ = driver::load_sim(cfg, "test");
    alloc_ = std::make_unique<core::DeviceAllocator>(*drv_, 0, opts);
  }
  void TearDown() override {
    if (alloc_) {
      EXPECT_EQ(alloc_->check_invariants(), "");
    }
    alloc_.reset();
    for (CUstream s : streams_) drv_->table().stream_destroy(s);
    streams_.clear();
    if (drv_) {
      sim::Outstanding o = sim::outstanding();
      EXPECT_EQ(o.reservations, 0u) << sim::describe_outstanding();
      EXPECT_EQ(o.allocations, 0u) << sim::describe_outstanding();
      EXPECT_EQ(o.mappings, 0u) << sim::describe_outstanding();
    }
    drv_.reset();
  }

  // "" when the allocator's books hold together (check_invariants) and agree with what the driver
  // holds: mapped, physical and reserved bytes; otherwise what disagrees. sim::outstanding()
  // walks every mapping, so loops call this every few dozen steps, not every step.
  std::string books_vs_driver() const {
    const std::string inv = alloc_->check_invariants();
    if (!inv.empty()) return inv;
    const core::DeviceStats st = alloc_->stats();
    const sim::Outstanding o = sim::outstanding();
    std::string out;
    auto cmp = [&out](const char* what, uint64_t books, uint64_t driver) {
      if (books != driver) {
        out += std::string(out.empty() ? "" : "; ") + what + ": books " + std::to_string(books) +
               ", driver " + std::to_string(driver);
      }
    };
    cmp("mapped bytes", st.mapped_bytes, o.mapped_bytes);
    cmp("physical bytes", st.physical_bytes, o.physical_bytes);
    cmp("reserved VA bytes", st.va_reserved_bytes, o.reserved_bytes);
    return out;
  }

  // Makes device 0's primary context current on this thread for the scope (the test's own driver
  // calls: oracle events, handle and access queries).
  struct PrimaryCtx {
    explicit PrimaryCtx(const driver::DriverTable& t) : t_(t) {
      t_.device_get(&dev_, 0);
      t_.device_primary_ctx_retain(&ctx_, dev_);
      t_.ctx_push_current(ctx_);
    }
    ~PrimaryCtx() {
      CUcontext popped = nullptr;
      t_.ctx_pop_current(&popped);
      t_.device_primary_ctx_release(dev_);
    }
    PrimaryCtx(const PrimaryCtx&) = delete;
    PrimaryCtx& operator=(const PrimaryCtx&) = delete;
    const driver::DriverTable& t_;
    CUdevice dev_ = 0;
    CUcontext ctx_ = nullptr;
  };

  // Access flags of device 0 at ptr; -1 when nothing is mapped there.
  int access_at(CUdeviceptr ptr) {
    PrimaryCtx c(drv_->table());
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    unsigned long long flags = 0;
    if (drv_->table().mem_get_access(&flags, &loc, ptr) != CUDA_SUCCESS) return -1;
    return static_cast<int>(flags);
  }

  // Handle mapped at ptr, 0 when none.
  CUmemGenericAllocationHandle handle_at(CUdeviceptr ptr) {
    CUmemGenericAllocationHandle h = 0;
    if (drv_->table().mem_retain_allocation_handle(&h, reinterpret_cast<void*>(ptr)) !=
        CUDA_SUCCESS) {
      return 0;
    }
    drv_->table().mem_release(h);
    return h;
  }

  // A new stream on device 0 (created in its primary context).
  CUstream new_stream(int device = 0) {
    const auto& t = drv_->table();
    CUdevice dev = 0;
    t.device_get(&dev, device);
    CUcontext ctx = nullptr;
    EXPECT_EQ(t.device_primary_ctx_retain(&ctx, dev), CUDA_SUCCESS);
    EXPECT_EQ(t.ctx_push_current(ctx), CUDA_SUCCESS);
    CUstream s = nullptr;
    EXPECT_EQ(t.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    t.ctx_pop_current(&popped);
    t.device_primary_ctx_release(dev);
    streams_.push_back(s);
    return s;
  }

  std::unique_ptr<driver::LoadedDriver> drv_;
  std::unique_ptr<core::DeviceAllocator> alloc_;
  std::vector<CUstream> streams_;
};

// Patterns derived from a seed, written at up to 19 spots of [p, p+n): both ends, the middle and
// 16 spots spread in between — so a 32 GiB block does not need 32 GiB of host RAM.
inline constexpr size_t kPatternSpots = 19;

inline size_t pattern_offset(size_t n, size_t i) {
  switch (i) {
    case 0: return 0;
    case 1: return n - 1;
    case 2: return n / 2;
    default: return (n / (kPatternSpots - 2)) * (i - 2);
  }
}

inline uint8_t pattern_byte(uint64_t seed, size_t off) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + off * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x ^ (x >> 17));
}

inline void fill_pattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<volatile uint8_t*>(p);
  for (size_t i = 0; i < kPatternSpots && n > 0; ++i) {
    size_t off = pattern_offset(n, i);
    b[off] = pattern_byte(seed, off);
  }
}

// Checks the first `spots` spots (3: both ends and the middle). Returns the first offset whose
// byte differs, or SIZE_MAX when intact.
inline size_t check_pattern(const void* p, size_t n, uint64_t seed,
                            size_t spots = kPatternSpots) {
  const auto* b = static_cast<const volatile uint8_t*>(p);
  for (size_t i = 0; i < spots && n > 0; ++i) {
    size_t off = pattern_offset(n, i);
    if (b[off] != pattern_byte(seed, off)) return off;
  }
  return SIZE_MAX;
}

}  // namespace expanse::test
