// A C ABI test that runs twice: on the in-process sim (driver:sim, param "sim") and on
// libexpanse_simcuda.so loaded as the CUDA driver (driver:cuda,driver_library:..., param
// "simcuda"), where the test's streams and events come from the same library. Shutdown checks
// that the driver holds nothing any more (no handle, mapping or VA leaked). The test's own
// streams and primary contexts (stream(), primary()) are given back before it.
#pragma once

#include "api/runtime.hpp"
#include "expanse/expanse.h"
#include "sim/sim.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>

#include <string>
#include <utility>
#include <vector>

namespace expanse::test {

// Whether blocks [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

class TwoDrivers : public ::testing::TestWithParam<std::string> {
 protected:
  bool dlopened() const { return GetParam() == "simcuda"; }

  // expanse_init with `conf` (sim options included) on this case's driver.
  void start(const std::string& conf) {
    if (dlopened()) {
      if (lib_ == nullptr) lib_ = dlopen(EXPANSE_SIMCUDA_PATH, RTLD_NOW | RTLD_LOCAL);
      ASSERT_NE(lib_, nullptr) << dlerror();
      auto configure =
          reinterpret_cast<int (*)(const char*)>(dlsym(lib_, "expanse_sim_configure"));
      hold_ = reinterpret_cast<void (*)(void*)>(dlsym(lib_, "expanse_sim_hold_stream"));
      release_ = reinterpret_cast<void (*)(void*)>(dlsym(lib_, "expanse_sim_release_stream"));
      release_all_ = reinterpret_cast<void (*)()>(dlsym(lib_, "expanse_sim_release_all"));
      ASSERT_TRUE(configure != nullptr && hold_ != nullptr && release_ != nullptr &&
                  release_all_ != nullptr);
      ASSERT_EQ(configure(conf.c_str()), 0);
      const std::string full =
          "driver:cuda,driver_library:" + std::string(EXPANSE_SIMCUDA_PATH) + "," + conf;
      ASSERT_EQ(expanse_init(full.c_str()), EXPANSE_OK) << expanse_last_error();
    } else {
      hold_ = [](void* s) { expanse::sim::hold_stream(static_cast<CUstream>(s)); };
      release_ = [](void* s) { expanse::sim::release_stream(static_cast<CUstream>(s)); };
      release_all_ = [] { expanse::sim::release_all(); };
      ASSERT_EQ(expanse_init(("driver:sim," + conf).c_str()), EXPANSE_OK) << expanse_last_error();
    }
    started_ = true;
  }

  // Lets held work run, gives back the test's streams and contexts, shuts expanse down and
  // checks the driver holds nothing after it (start() may follow). A fixture with resources of
  // its own (events) gives them back first, then calls this.
  void stop() {
    if (!started_) return;
    started_ = false;
    release_all_();
    for (auto& [dev, s] : streams_) {
      push(dev);
      t().stream_destroy(s);
      pop();
    }
    streams_.clear();
    for (auto& [dev, ctx] : retained_) {
      (void)ctx;
      CUdevice d = 0;
      t().device_get(&d, dev);
      t().device_primary_ctx_release(d);
    }
    retained_.clear();
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
    if (lib_ != nullptr) {
      auto outstanding = reinterpret_cast<int (*)(unsigned long long*, unsigned long long*,
                                                  unsigned long long*, unsigned long long*)>(
          dlsym(lib_, "expanse_sim_outstanding"));
      unsigned long long r = 0, a = 0, m = 0, b = 0;
      if (outstanding != nullptr) outstanding(&r, &a, &m, &b);
      EXPECT_EQ(r + a + m + b, 0u) << "the sim library holds resources after shutdown";
    } else {
      EXPECT_TRUE(expanse::sim::outstanding().empty()) << expanse::sim::describe_outstanding();
    }
  }

  void TearDown() override {
    stop();
    if (lib_ != nullptr) {
      dlclose(lib_);
      lib_ = nullptr;
    }
  }

  const expanse::driver::DriverTable& t() { return expanse::api::Runtime::get().driver().table(); }

  // Device dev's primary context, retained until stop().
  CUcontext primary(int dev) {
    for (auto& [d, c] : retained_) {
      if (d == dev) return c;
    }
    CUdevice d = 0;
    EXPECT_EQ(t().device_get(&d, dev), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    EXPECT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
    retained_.emplace_back(dev, ctx);
    return ctx;
  }
  void push(int dev) { ASSERT_EQ(t().ctx_push_current(primary(dev)), CUDA_SUCCESS); }
  void pop() {
    CUcontext c = nullptr;
    t().ctx_pop_current(&c);
  }
  // A stream created in device dev's primary context (destroyed at stop() unless destroy()ed).
  CUstream stream(int dev = 0, unsigned flags = CU_STREAM_NON_BLOCKING) {
    push(dev);
    CUstream s = nullptr;
    EXPECT_EQ(t().stream_create(&s, flags), CUDA_SUCCESS);
    pop();
    streams_.emplace_back(dev, s);
    return s;
  }
  void destroy(CUstream s) {
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i].second == s) {
        push(streams_[i].first);
        EXPECT_EQ(t().stream_destroy(s), CUDA_SUCCESS);
        pop();
        streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
    ADD_FAILURE() << "not a test stream";
  }

  bool started_ = false;
  void* lib_ = nullptr;
  void (*hold_)(void*) = nullptr;  // keeps a stream's work pending
  void (*release_)(void*) = nullptr;  // lets one held stream's work run
  void (*release_all_)() = nullptr;  // lets every held stream's work run
  std::vector<std::pair<int, CUstream>> streams_;
  std::vector<std::pair<int, CUcontext>> retained_;
};

}  // namespace expanse::test
