// Shared fixture of the sim's unit tests: a fresh sim per test, the in-process table, helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "sim/sim.hpp"
#include "sim/sim_entry.hpp"

namespace expanse::sim::testing {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

inline CUmemAllocationProp device_prop(int device = 0) {
  CUmemAllocationProp p;
  std::memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

inline CUmemAccessDesc access(int device, CUmemAccess_flags flags) {
  CUmemAccessDesc d;
  std::memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = flags;
  return d;
}

inline CUmemLocation device_location(int device) {
  CUmemLocation l;
  l.type = CU_MEM_LOCATION_TYPE_DEVICE;
  l.id = device;
  return l;
}

template <class T = void>
T* as_ptr(CUdeviceptr p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

// An enum holding any int (out-of-range values a C caller can pass). Never load it into an enum
// variable in the tests (UBSan); pass it straight to the sim, which reads its bits.
template <class E>
E as_enum(int v) {
  return static_cast<E>(v);
}

// Lines of /proc/self/maps: the process's host mappings.
inline size_t host_mapping_count() {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

class SimTest : public ::testing::Test {
 protected:
  virtual SimConfig config() const {
    SimConfig c;
    c.devices = 2;
    c.capacity = 1 * GiB;
    c.granularity = 2 * MiB;
    return c;
  }
  void SetUp() override {
    reset(config());
    ASSERT_EQ(CUDA_SUCCESS, t().init(0));
    gran_ = config().granularity;
  }
  void TearDown() override {
    // Leave no host mappings behind for the next test in this process.
    reset(config());
  }

  const driver::DriverTable& t() const { return table(); }

  // The CUdevice of an ordinal (cuDeviceGet): the sim's are not the ordinals.
  CUdevice dev(int ordinal) const {
    CUdevice d = -1;
    EXPECT_EQ(CUDA_SUCCESS, t().device_get(&d, ordinal));
    return d;
  }

  CUcontext make_current(int device = 0) {
    CUcontext ctx = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx, dev(device)));
    EXPECT_EQ(CUDA_SUCCESS, t().ctx_set_current(ctx));
    return ctx;
  }
  CUdeviceptr reserve(size_t size, size_t alignment = 0, CUdeviceptr hint = 0) {
    CUdeviceptr p = 0;
    EXPECT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&p, size, alignment, hint, 0));
    return p;
  }
  CUmemGenericAllocationHandle create(size_t size, int device = 0) {
    CUmemGenericAllocationHandle h = 0;
    const CUmemAllocationProp p = device_prop(device);
    EXPECT_EQ(CUDA_SUCCESS, t().mem_create(&h, size, &p, 0));
    return h;
  }
  CUresult set_access(CUdeviceptr p, size_t size, int device, CUmemAccess_flags flags) {
    const CUmemAccessDesc d = access(device, flags);
    return t().mem_set_access(p, size, &d, 1);
  }
  // reserve + create + map + read/write access: a usable buffer of size bytes on device.
  struct Buffer {
    CUdeviceptr va = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  Buffer make_buffer(size_t size, int device = 0) {
    Buffer b;
    b.size = size;
    b.va = reserve(size);
    b.handle = create(size, device);
    EXPECT_EQ(CUDA_SUCCESS, t().mem_map(b.va, size, 0, b.handle, 0));
    EXPECT_EQ(CUDA_SUCCESS, set_access(b.va, size, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    return b;
  }
  void free_buffer(const Buffer& b) {
    EXPECT_EQ(CUDA_SUCCESS, t().mem_unmap(b.va, b.size));
    EXPECT_EQ(CUDA_SUCCESS, t().mem_release(b.handle));
    EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(b.va, b.size));
  }

  size_t gran_ = 0;
};

}  // namespace expanse::sim::testing
