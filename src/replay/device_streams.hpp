// Streams created in a device's primary context for the CLI's workloads, one per id (id 0 is the
// legacy default stream, NULL, and is not created); destroyed in the same context. Also the
// synchronous copies the CLI reads and writes device memory with, the same way on the sim and on
// a real GPU.
#pragma once

#include "driver/driver.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::replay {

class DeviceStreams {
 public:
  DeviceStreams(const driver::LoadedDriver& drv, int device, const std::vector<uint64_t>& ids);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  CUstream operator[](size_t i) const { return streams_[i]; }
  size_t size() const noexcept { return streams_.size(); }

  // The device's primary context made current while it lives (push / pop), for a run of copies.
  class Current {
   public:
    explicit Current(const DeviceStreams& s) : s_(s) { s_.push(); }
    ~Current() { s_.pop(); }
    Current(const Current&) = delete;
    Current& operator=(const Current&) = delete;

   private:
    const DeviceStreams& s_;
  };

  // cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2: synchronous copies of `bytes` between host memory and
  // device memory (a pointer the allocator returned). The caller holds a Current. Throws
  // driver::driver_error when the driver refuses.
  void to_device(void* dst, const void* src, size_t bytes) const;
  void to_host(void* dst, const void* src, size_t bytes) const;

 private:
  void push() const;
  void pop() const;

  const driver::LoadedDriver& drv_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  std::vector<CUstream> streams_;
  std::vector<CUstream> created_;
};

}  // namespace expanse::replay
