// A C ABI test that runs twice: on the in-process sim (driver:sim, param "sim") and on
// libexpanse_simcuda.so loaded as the CUDA driver (driver:cuda,driver_library:..., param
// "simcuda"), where the test's streams and events come from the same library. Shutdown checks
// that the driver holds nothing any more (no handle, mapping or VA leaked).
#pragma once

#include "api/runtime.hpp"
#include "expanse/expanse.h"
#include "sim/sim.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

namespace expanse::test {

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
      release_all_ = reinterpret_cast<void (*)()>(dlsym(lib_, "expanse_sim_release_all"));
      ASSERT_TRUE(configure != nullptr && hold_ != nullptr && release_all_ != nullptr);
      ASSERT_EQ(configure(conf.c_str()), 0);
      const std::string full =
          "driver:cuda,driver_library:" + std::string(EXPANSE_SIMCUDA_PATH) + "," + conf;
      ASSERT_EQ(expanse_init(full.c_str()), EXPANSE_OK) << expanse_last_error();
    } else {
      hold_ = [](void* s) { expanse::sim::hold_stream(static_cast<CUstream>(s)); };
      release_all_ = [] { expanse::sim::release_all(); };
      ASSERT_EQ(expanse_init(("driver:sim," + conf).c_str()), EXPANSE_OK) << expanse_last_error();
    }
    started_ = true;
  }

  // Shuts expanse down and checks the driver holds nothing after it. A fixture with streams or
  // contexts of its own releases them first, then calls this.
  void TearDown() override {
    if (started_) {
      EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
    }
    if (lib_ != nullptr) {
      auto outstanding = reinterpret_cast<int (*)(unsigned long long*, unsigned long long*,
                                                  unsigned long long*, unsigned long long*)>(
          dlsym(lib_, "expanse_sim_outstanding"));
      unsigned long long r = 0, a = 0, m = 0, b = 0;
      if (outstanding != nullptr) outstanding(&r, &a, &m, &b);
      EXPECT_EQ(r + a + m + b, 0u) << "the sim library holds resources after shutdown";
      dlclose(lib_);
      lib_ = nullptr;
    } else if (started_) {
      EXPECT_TRUE(expanse::sim::outstanding().empty()) << expanse::sim::describe_outstanding();
    }
    started_ = false;
  }

  const expanse::driver::DriverTable& t() { return expanse::api::Runtime::get().driver().table(); }

  bool started_ = false;
  void* lib_ = nullptr;
  void (*hold_)(void*) = nullptr;  // keeps a stream's work pending
  void (*release_all_)() = nullptr;  // lets every held stream's work run
};

}  // namespace expanse::test
