// What the selftest's checks and calibration share: the driver table and the device, a way to
// fail a check with a message, and guards that give back what a check took (reservations,
// handles, mappings, the current context) whatever happens.
#pragma once

#include "driver/driver.hpp"

#include <cstddef>
#include <string>

namespace expanse::tools::selftest {

// Thrown by a check that found the driver breaking a rule; the message says what happened.
struct Failed {
  std::string message;
};

class Env {
 public:
  Env(const driver::LoadedDriver& drv, int ordinal);
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  const driver::DriverTable& t;
  const driver::LoadedDriver& drv;
  int ordinal = 0;
  CUdevice dev{};         // from cuDeviceGet, not the ordinal
  CUcontext ctx = nullptr;  // the primary context, retained
  size_t granularity = 0;   // minimum, for pinned device memory on this device

  // "CUDA_ERROR_INVALID_VALUE" (the driver's own name, or the number).
  std::string code_name(CUresult r) const;
  // Fails the check unless r is CUDA_SUCCESS: "<what> failed: CUDA_ERROR_...".
  void ok(CUresult r, const std::string& what) const;
  // Fails the check unless r == want: "<what> returned X, expected Y".
  void expect_code(CUresult r, CUresult want, const std::string& what) const;
  // Fails the check with message unless cond.
  static void require(bool cond, const std::string& message);

  // Pinned device memory on this device (location.id is the ordinal, as the driver wants).
  CUmemAllocationProp prop() const;
  CUmemAccessDesc read_write() const;
  CUmemLocation location() const;
  // cuMemGetInfo (the caller holds a Current).
  size_t free_bytes() const;
};

// The primary context current on this thread while it lives.
class Current {
 public:
  explicit Current(const Env& e);
  ~Current();
  Current(const Current&) = delete;
  Current& operator=(const Current&) = delete;

 private:
  const Env& e_;
};

// A VA reservation, freed on destruction unless free() was called.
class Va {
 public:
  Va(const Env& e, size_t size, size_t alignment = 0);
  ~Va();
  Va(const Va&) = delete;
  Va& operator=(const Va&) = delete;
  CUdeviceptr base() const { return base_; }
  CUdeviceptr at(size_t offset) const { return base_ + offset; }
  size_t size() const { return size_; }
  CUresult free();

 private:
  const Env& e_;
  CUdeviceptr base_ = 0;
  size_t size_ = 0;
};

// A physical allocation (one reference), released on destruction unless release() was called.
class Handle {
 public:
  Handle(const Env& e, size_t size);
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  CUmemGenericAllocationHandle get() const { return h_; }
  size_t size() const { return size_; }
  CUresult release();

 private:
  const Env& e_;
  CUmemGenericAllocationHandle h_{};
  size_t size_ = 0;
  bool held_ = false;
};

// A mapping of a whole handle at ptr, unmapped on destruction unless unmap() was called.
class Mapping {
 public:
  Mapping(const Env& e, CUdeviceptr ptr, const Handle& h);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  CUdeviceptr ptr() const { return ptr_; }
  // Read and write for this device over the whole mapping.
  void grant() const;
  CUresult unmap();
  // The mapping is gone by other means (an unmap over a range that covered it).
  void forget() { mapped_ = false; }

 private:
  const Env& e_;
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace expanse::tools::selftest
