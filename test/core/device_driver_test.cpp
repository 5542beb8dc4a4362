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

// Finding 8: ~DeviceDriver releases the primary context of the CUdevice it retained, not of the
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

}  // namespace
}  // namespace expanse::test
