// Streams created in a device's primary context for the CLI's workloads, one per id (id 0 is the
// legacy default stream, NULL, and is not created); destroyed in the same context.
#pragma once

#include "driver/driver.hpp"

#include <cstdint>
#include <vector>

namespace expanse::tools {

class DeviceStreams {
 public:
  DeviceStreams(const driver::LoadedDriver& drv, int device, const std::vector<uint64_t>& ids);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  CUstream operator[](size_t i) const { return streams_[i]; }
  size_t size() const noexcept { return streams_.size(); }

 private:
  void push() const;
  void pop() const;

  const driver::LoadedDriver& drv_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  std::vector<CUstream> streams_;
  std::vector<CUstream> created_;
};

}  // namespace expanse::tools
