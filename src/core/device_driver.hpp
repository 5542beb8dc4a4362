// The driver as one device's allocator sees it: every call made in that device's primary
// context, counted per entry point, and priced by the cost model (stats.driver_calls and
// modeled_driver_ns). Failures throw driver::driver_error naming the entry point.
#pragma once

#include "core/stats.hpp"
#include "driver/cost_model.hpp"
#include "driver/driver.hpp"

#include <cstddef>
#include <vector>

namespace expanse::core {

class DeviceDriver {
 public:
  DeviceDriver(const driver::LoadedDriver& drv, int device);
  ~DeviceDriver();
  DeviceDriver(const DeviceDriver&) = delete;
  DeviceDriver& operator=(const DeviceDriver&) = delete;

  int device() const noexcept { return device_; }
  size_t granularity() const noexcept { return granularity_; }
  size_t total_memory() const noexcept { return total_memory_; }
  const driver::LoadedDriver& loaded() const noexcept { return drv_; }

  // Makes the device's primary context current for the scope; restores the caller's after.
  class ScopedContext {
   public:
    explicit ScopedContext(DeviceDriver& d);
    ~ScopedContext();
    ScopedContext(const ScopedContext&) = delete;
    ScopedContext& operator=(const ScopedContext&) = delete;

   private:
    DeviceDriver& d_;
    bool pushed_ = false;
  };

  // VMM. size is in bytes; `pages` = size / granularity for the cost model.
  CUdeviceptr reserve(size_t size, size_t alignment);
  void address_free(CUdeviceptr va, size_t size);
  // Returns CUDA_ERROR_OUT_OF_MEMORY instead of throwing it (an expected outcome); throws others.
  CUresult create(size_t size, CUmemGenericAllocationHandle* out);
  // size: the handle's bytes (for the cost model).
  void release(CUmemGenericAllocationHandle h, size_t size);
  void map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
  // mappings: how many handles [va, va+size) covers (for the cost model).
  void unmap(CUdeviceptr va, size_t size, size_t mappings);
  void set_access(CUdeviceptr va, size_t size, size_t mappings);

  // Streams and events (stream-ordered reuse).
  CUevent event_create();
  void event_destroy(CUevent e);
  void event_record(CUevent e, CUstream s);
  // Records e on s and returns true; if s no longer exists (destroyed: CUDA_ERROR_INVALID_HANDLE),
  // waits for all of the device's work instead (a destroyed stream's work still runs to the end)
  // and returns false — nothing recorded, nothing left to wait for.
  bool event_record_or_synchronize(CUevent e, CUstream s);
  void ctx_synchronize();
  bool event_query(CUevent e);  // true when complete
  void event_synchronize(CUevent e);

  // Accounting, read under the owner's lock.
  const std::array<uint64_t, driver::kEntryPointCount>& calls() const noexcept { return calls_; }
  double modeled_ns() const noexcept { return modeled_ns_; }

 private:
  // mappings: how many handles a range call (unmap, set_access) covers.
  void count(driver::EntryPoint e, size_t bytes, size_t mappings = 1);
  void check(CUresult r, driver::EntryPoint e) const { drv_.check(r, e); }

  const driver::LoadedDriver& drv_;
  const driver::DriverTable& t_;
  int device_;
  CUcontext ctx_ = nullptr;
  size_t granularity_ = 0;
  size_t total_memory_ = 0;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::array<uint64_t, driver::kEntryPointCount> calls_{};
  double modeled_ns_ = 0;
};

}  // namespace expanse::core
