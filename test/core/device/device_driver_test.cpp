// DeviceDriver: what one device's allocator asks of the driver.
#include "core_fixture.hpp"

namespace expanse::test {
namespace {

decltype(&::cuDevicePrimaryCtxRelease_v2) g_real_release = nullptr;
std::vector<CUresult> g_release_results;
CUresult recording_release(CUdevice d) {
  CUresult r = g_real_release(d);
  g_release_results.push_back(r);
  return r;
}

// ~DeviceDriver releases the primary context of the CUdevice it retained, not of the
// ordinal (the sim hands out CUdevice values that differ from ordinals, as a driver may).
TEST(DeviceDriverTest, ReleasesThePrimaryContextItRetained) {
  auto drv = driver::load_sim(sim_config(1 * GiB, true, 2), "test");
  driver::DriverTable t = drv->table();
  g_real_release = t.device_primary_ctx_release;
  t.device_primary_ctx_release = recording_release;
  driver::LoadedDriver wrapped(t, driver::DriverKind::sim, "release recorded", nullptr);
  g_release_results.clear();
  for (int d = 0; d < 2; ++d) {
    core::DeviceAllocator a(wrapped, d, core::AllocatorOptions{});
    void* p = a.allocate(1 * MiB, nullptr);
    a.deallocate(p, nullptr);
  }
  ASSERT_EQ(g_release_results.size(), 2u);
  for (CUresult r : g_release_results) EXPECT_EQ(r, CUDA_SUCCESS);
}

// The WSL2 RDMA probe drops the flag only when cuMemSetAccess refuses RDMA-capable memory and
// accepts plain memory; memory running out during the probe proves nothing (a transient
// OUT_OF_MEMORY would have cost NCCL its GPUDirect for the life of the process).
TEST(DeviceDriverTest, RdmaProbeKeepsTheFlagWhenMemoryRunsOut) {
  auto drv = driver::load_sim(sim_config(1 * GiB), "test");
  sim::inject_failure(driver::EntryPoint::mem_set_access, 1, CUDA_ERROR_OUT_OF_MEMORY);
  core::DeviceDriver kept(*drv, 0, /*rdma=*/true);
  EXPECT_TRUE(kept.rdma_capable());
  sim::clear_injections();
  sim::inject_failure(driver::EntryPoint::mem_set_access, 1, CUDA_ERROR_UNKNOWN);
  core::DeviceDriver dropped(*drv, 0, /*rdma=*/true);  // refused with the flag, fine without
  EXPECT_FALSE(dropped.rdma_capable());
  sim::clear_injections();
  core::DeviceDriver plain(*drv, 0, /*rdma=*/true);
  EXPECT_TRUE(plain.rdma_capable());
}

}  // namespace
}  // namespace expanse::test

namespace expanse::test {
namespace {

// EXPANSE_DRIVER_TRACE wraps the table the loader hands out: errors names each failing call
// (entry point, first argument, code) and nothing else; a bad value is refused by name.
TEST(DriverTrace, ErrorsModeReportsFailingCallsOnly) {
  ::setenv("EXPANSE_DRIVER_TRACE", "errors", 1);
  auto drv = driver::load_sim(sim::SimConfig{}, "trace test");
  ::unsetenv("EXPANSE_DRIVER_TRACE");
  CUdevice d = 0;
  testing::internal::CaptureStderr();
  EXPECT_EQ(drv->table().device_get(&d, 0), CUDA_SUCCESS);
  EXPECT_EQ(drv->table().device_get(&d, 99), CUDA_ERROR_INVALID_DEVICE);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("cuDeviceGet(0x"), std::string::npos) << err;
  EXPECT_NE(err.find(") -> 101"), std::string::npos) << err;
  EXPECT_EQ(err.find("cuDeviceGet"), err.rfind("cuDeviceGet")) << "a successful call was traced";
  drv = driver::load_sim(sim::SimConfig{}, "untraced");  // unset again: nothing is written
  testing::internal::CaptureStderr();
  EXPECT_EQ(drv->table().device_get(&d, 99), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(DriverTrace, UnknownModeIsRefusedByName) {
  ::setenv("EXPANSE_DRIVER_TRACE", "verbose", 1);
  try {
    driver::load_sim(sim::SimConfig{}, "trace test");
    ADD_FAILURE() << "no error";
  } catch (const driver::driver_error& e) {
    EXPECT_NE(std::string(e.what()).find("'verbose'"), std::string::npos) << e.what();
  }
  ::unsetenv("EXPANSE_DRIVER_TRACE");
}

}  // namespace
}  // namespace expanse::test
