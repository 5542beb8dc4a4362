// The process-wide state behind the C ABI and the C++ free functions: the driver, chosen once
// from EXPANSE_CONF, and one allocator per device, created on first use.
#pragma once

#include "api/host_pools.hpp"
#include "api/pool_routes.hpp"
#include "api/pool_registry.hpp"
#include "conf/config.hpp"
#include "core/base/options.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace expanse::api {

class Runtime {
 public:
  // The runtime, configured from EXPANSE_CONF on first use. Throws usage_error / driver_failure
  // when configuration or driver loading fails (and tries again on the next call), and
  // driver_failure in a child forked after the driver was initialised (fork_guard.hpp).
  static Runtime& get();
  // Replaces the runtime with one configured from conf. Throws usage_error if blocks are live.
  static void init(const std::string& conf);
  // Destroys the runtime (everything is given back to the driver). Throws if blocks are live.
  static void shutdown();
  // The runtime if it exists, without creating it.
  static Runtime* current() noexcept;

  core::DeviceAllocator& device(int device);
  // The allocator of device d if it exists already, else nullptr.
  core::DeviceAllocator* existing(int device) const;
  // What a device not set up yet would be set up with, without setting it up (no context is
  // created: cuDeviceGet and cuDeviceTotalMem need none): its capacity and the limit the
  // configuration gives it (kNoLimit: none). Throws usage_error for a device that does not exist.
  struct Unset {
    size_t capacity = 0;
    size_t limit = core::kNoLimit;
  };
  Unset before_setup(int device) const;
  // Tells every device's allocator that the capture announced on s has ended.
  void capture_ended(CUstream s);
  int device_count() const noexcept { return static_cast<int>(slots_.size()); }
  const driver::LoadedDriver& driver() const noexcept { return *driver_; }
  // The pools created under this configuration (pools.hpp) and the routes to them
  // (pool_routes.hpp).
  PoolRegistry& pools() noexcept { return pools_; }
  PoolRoutes& routes() noexcept { return *routes_; }
  // Pinned host memory (expanse_host_*): a pool per host NUMA node (host_pools.hpp).
  HostPools& host() noexcept { return *host_; }

  ~Runtime();

 private:
  explicit Runtime(const std::string& conf);
  bool any_live() const;
  void check_exists(int device) const;
  size_t capacity_of(int device) const;  // driver_failure naming the device when the driver fails

  conf::Config config_;
  std::unique_ptr<driver::LoadedDriver> driver_;
  std::mutex create_mu_;
  std::vector<std::atomic<core::DeviceAllocator*>> slots_;
  std::vector<std::unique_ptr<core::DeviceAllocator>> owned_;
  PoolRegistry pools_;
  std::unique_ptr<PoolRoutes> routes_;
  std::unique_ptr<HostPools> host_;  // before the allocators go: it runs in their contexts
};

}  // namespace expanse::api
