// Rules for initialisation, devices, attributes and error strings.
#include "conformance.hpp"

#include <algorithm>
#include <vector>

#include <cstring>
#include <string>

namespace expanse::conformance {
namespace {

// Before cuInit every driver API answers NOT_INITIALIZED.
TEST_P(Conformance, NotInitializedBeforeCuInit) {
  CONFORMANCE_REQUIRE_SIM("needs a driver on which cuInit has not been called");
  ASSERT_NO_FATAL_FAILURE(reset_uninitialized());
  int count = -1;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().device_get_count(&count));
  CUdevice dev = -1;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().device_get(&dev, 0));
  int value = -1;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED,
            t().device_get_attribute(
                &value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CUcontext ctx = nullptr;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().device_primary_ctx_retain(&ctx, 0));
  CUdeviceptr p = 0;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, try_reserve(&p, gran()));
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, try_create(&h, gran(), device_prop(0)));
  size_t g = 0;
  const CUmemAllocationProp prop = device_prop(0);
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED,
            t().mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().mem_get_info(&free_bytes, &total));
  // ...and cuInit makes them work.
  ASSERT_CU(CUDA_SUCCESS, t().init(0));
  EXPECT_CU(CUDA_SUCCESS, t().device_get_count(&count));
  EXPECT_EQ(count, kSimDevices);
}

// cuDriverGetVersion, cuGetErrorName/String work before cuInit.
TEST_P(Conformance, VersionAndErrorStringsWorkBeforeCuInit) {
  CONFORMANCE_REQUIRE_SIM("needs a driver on which cuInit has not been called");
  ASSERT_NO_FATAL_FAILURE(reset_uninitialized());
  int version = 0;
  EXPECT_CU(CUDA_SUCCESS, t().driver_get_version(&version));
  EXPECT_GE(version, 13000);
  const char* name = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().get_error_name(CUDA_ERROR_OUT_OF_MEMORY, &name));
  ASSERT_NE(name, nullptr);
  EXPECT_STREQ(name, "CUDA_ERROR_OUT_OF_MEMORY");
  const char* text = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().get_error_string(CUDA_ERROR_INVALID_VALUE, &text));
  ASSERT_NE(text, nullptr);
  EXPECT_STREQ(text, "invalid argument");
  EXPECT_CU(CUDA_SUCCESS, t().init(0));
}

// cuInit's flags must be 0.
TEST_P(Conformance, InitWithNonZeroFlagsIsInvalidValue) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().init(1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().init(0x80000000u));
  // The driver stays initialised; cuInit(0) is idempotent.
  EXPECT_CU(CUDA_SUCCESS, t().init(0));
  EXPECT_CU(CUDA_SUCCESS, t().init(0));
  int count = 0;
  EXPECT_CU(CUDA_SUCCESS, t().device_get_count(&count));
  EXPECT_EQ(count, device_count());
}

// Ordinals outside [0, count) are INVALID_DEVICE; NULL output is INVALID_VALUE.
TEST_P(Conformance, DeviceGetBadOrdinalIsInvalidDevice) {
  CUdevice dev = -7;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_get(&dev, device_count()));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_get(&dev, -1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().device_get(nullptr, 0));
  // The driver promises distinct CUdevice values, not that they are the ordinals (the sim's are
  // not; see CUdeviceIsNotTheOrdinal).
  std::vector<CUdevice> seen;
  for (int i = 0; i < device_count(); ++i) {
    EXPECT_CU(CUDA_SUCCESS, t().device_get(&dev, i));
    EXPECT_EQ(std::count(seen.begin(), seen.end(), dev), 0) << "device " << i;
    seen.push_back(dev);
  }
  if (hooks() != nullptr) {
    EXPECT_EQ(device_count(), kSimDevices);
  }
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().device_get_count(nullptr));
}

// An attribute the driver does not know is INVALID_VALUE; a bad device is
// INVALID_DEVICE; NULL output is INVALID_VALUE.
TEST_P(Conformance, DeviceGetAttributeMisuse) {
  int value = -1;
  const CUdevice d0 = dev(0);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_MAX, d0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            call_raw(t().device_get_attribute, &value, 100000, d0));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE,
            t().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     device_count()));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            t().device_get_attribute(nullptr, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     d0));
}

// A VMM-capable device reports attribute 102 (VMM supported) and 41 (UVA) as 1.
TEST_P(Conformance, DeviceReportsVirtualMemoryManagementSupported) {
  for (int o = 0; o < device_count(); ++o) {
    const CUdevice d = dev(o);
    int vmm = -1;
    EXPECT_CU(CUDA_SUCCESS,
              t().device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d));
    EXPECT_EQ(vmm, 1) << "device " << d;
    int raw102 = -1;
    EXPECT_CU(CUDA_SUCCESS, t().device_get_attribute(&raw102, static_cast<CUdevice_attribute>(102), d));
    EXPECT_EQ(raw102, 1);
    int uva = -1;
    EXPECT_CU(CUDA_SUCCESS, t().device_get_attribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d));
    EXPECT_EQ(uva, 1) << "device " << d;
  }
}

// cuDriverGetVersion is 1000*major+10*minor, at least the VMM version; NULL is INVALID_VALUE.
TEST_P(Conformance, DriverGetVersion) {
  int version = 0;
  EXPECT_CU(CUDA_SUCCESS, t().driver_get_version(&version));
  EXPECT_GE(version, 10020);
  EXPECT_EQ(version % 10, 0);
  if (hooks() != nullptr) {
    EXPECT_EQ(version, 13000);
  }
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().driver_get_version(nullptr));
}

// cuDeviceTotalMem reports the device's capacity (the sim: sim_capacity).
TEST_P(Conformance, DeviceTotalMemIsCapacity) {
  for (int o = 0; o < device_count(); ++o) {
    const CUdevice d = dev(o);
    size_t bytes = 0;
    EXPECT_CU(CUDA_SUCCESS, t().device_total_mem(&bytes, d));
    EXPECT_GT(bytes, 0u);
    if (hooks() != nullptr) {
      EXPECT_EQ(bytes, kSimCapacity) << "device " << d;
    }
  }
  size_t bytes = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_total_mem(&bytes, device_count()));
}

// Names and descriptions of known codes.
TEST_P(Conformance, ErrorNameAndStringOfKnownCodes) {
  struct Known {
    CUresult code;
    const char* name;
    const char* text;  // driver wording (cuGetErrorString), or nullptr
    bool verified;     // wording seen from a real driver; the others are checked on the sim only
  };
  const Known known[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS", nullptr, false},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument", true},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", false},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error", false},
      {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected", true},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal", false},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context", false},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle", false},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready", false},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported", false},
      {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error", false},
  };
  for (const Known& k : known) {
    const char* name = nullptr;
    EXPECT_CU(CUDA_SUCCESS, t().get_error_name(k.code, &name));
    ASSERT_NE(name, nullptr) << k.name;
    EXPECT_STREQ(name, k.name);
    const char* text = nullptr;
    EXPECT_CU(CUDA_SUCCESS, t().get_error_string(k.code, &text));
    ASSERT_NE(text, nullptr) << k.name;
    EXPECT_GT(std::strlen(text), 0u) << k.name;
    if (k.text != nullptr && (k.verified || hooks() != nullptr)) {
      EXPECT_STREQ(text, k.text) << k.name;
    }
  }
}

// An unknown code is INVALID_VALUE with *pStr = NULL.
TEST_P(Conformance, ErrorNameAndStringOfUnknownCode) {
  const char* name = "untouched";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, call_raw(t().get_error_name, 12345, &name));
  EXPECT_EQ(name, nullptr);
  const char* text = "untouched";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, call_raw(t().get_error_string, 12345, &text));
  EXPECT_EQ(text, nullptr);
}

}  // namespace
}  // namespace expanse::conformance
