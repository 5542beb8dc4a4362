// Rules for per-device access and peers, the device attributes that allocation properties
// depend on (POSIX file descriptors, RDMA with VMM), and drivers older than CUDA 13.
#include "conformance.hpp"

#include "driver_api/entry_points.hpp"
#include "sim/sim_entry.hpp"

#include <cstring>
#include <memory>
#include <string>

namespace expanse::conformance {
namespace {

int attribute(const driver::DriverTable& t, CUdevice_attribute a, CUdevice d) {
  int v = -1;
  return t.device_get_attribute(&v, a, d) == CUDA_SUCCESS ? v : -1;
}

// cuDeviceCanAccessPeer: a device is not its own peer; NULL output is INVALID_VALUE; a
// CUdevice that is no device is INVALID_DEVICE. The sim's distinct devices are peers.
TEST_P(Conformance, DeviceCanAccessPeer) {
  int can = -1;
  EXPECT_CU(CUDA_SUCCESS, t().device_can_access_peer(&can, dev(0), dev(0)));
  EXPECT_EQ(can, 0);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().device_can_access_peer(nullptr, dev(0), dev(0)));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_can_access_peer(&can, dev(0), -7));
  if (device_count() < 2) return;
  EXPECT_CU(CUDA_SUCCESS, t().device_can_access_peer(&can, dev(0), dev(1)));
  if (hooks() != nullptr) {
    EXPECT_EQ(can, 1);
  }
}

// Sim: sim_peer_access:false makes distinct devices non-peers, and granting a peer access to
// memory fails (INVALID_VALUE, as cuda-api-wrappers#512 saw without P2P).
TEST_P(Conformance, NoPeerAccessRefusesPeerGrants) {
  CONFORMANCE_REQUIRE_SIM("needs sim_peer_access");
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_peer_access:false"));
  int can = -1;
  EXPECT_CU(CUDA_SUCCESS, t().device_can_access_peer(&can, dev(0), dev(1)));
  EXPECT_EQ(can, 0);
  const Block b = make_block(1);
  const CUmemAccessDesc both[2] = {access_desc(0), access_desc(1)};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_set_access(b.ptr, b.size, both, 2));
  EXPECT_EQ(get_access(b.ptr, 1), 0u) << "a failed call changes nothing";
  EXPECT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE));
}

// cuMemSetAccess takes one descriptor per device in one call; cuMemGetAccess answers per
// location (the owner and the peer separately).
TEST_P(Conformance, SetAccessSeveralDevicesGetAccessPerLocation) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  int can = 0;
  ASSERT_CU(CUDA_SUCCESS, t().device_can_access_peer(&can, dev(1), dev(0)));
  if (can == 0) GTEST_SKIP() << "device 1 cannot access device 0";
  const Block b = make_block(2);
  EXPECT_EQ(get_access(b.ptr, 1), 0u) << "make_block granted device 0 only";
  const CUmemAccessDesc descs[2] = {access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_READ),
                                    access_desc(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  ASSERT_CU(CUDA_SUCCESS, t().mem_set_access(b.ptr, b.size, descs, 2));
  EXPECT_EQ(get_access(b.ptr, 0), static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_EQ(get_access(b.ptr + gran(), 1),
            static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 0));
  EXPECT_EQ(get_access(b.ptr, 1),
            static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
      << "a descriptor for one device leaves the others";
}

// Sim: a synchronous copy runs on the current context's device and needs that device's access
// (the real driver would fault asynchronously or report ILLEGAL_ADDRESS).
TEST_P(Conformance, CopyNeedsTheCurrentDevicesAccess) {
  CONFORMANCE_REQUIRE_SIM("a real driver faults instead of refusing the copy");
  const Block b = make_block(1);  // device 0 only
  const CUcontext ctx0 = make_current();
  int value = 42;
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, &value, sizeof value));
  CUcontext ctx1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx1, dev(1)));
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(ctx1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(b.ptr, &value, sizeof value));
  ASSERT_CU(CUDA_SUCCESS, set_access(b.ptr, b.size, 1, CU_MEM_ACCESS_FLAGS_PROT_READ));
  int back = 0;
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh(&back, b.ptr, sizeof back));
  EXPECT_EQ(back, 42);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod(b.ptr, &value, sizeof value))
      << "read-only for device 1";
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(ctx0));
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
}

// cuMemCreate asks for POSIX file-descriptor handles where attribute 103 says the device
// supports them; where it does not, the request is NOT_SUPPORTED.
TEST_P(Conformance, CreatePosixFdFollowsAttribute103) {
  const int fd = attribute(t(), CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           dev(0));
  ASSERT_GE(fd, 0);
  CUmemAllocationProp prop = device_prop(0);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  if (fd != 0) {
    ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), prop));
    CUmemAllocationProp got;
    std::memset(&got, 0, sizeof got);
    EXPECT_CU(CUDA_SUCCESS, t().mem_get_allocation_properties_from_handle(&got, h));
    EXPECT_EQ(static_cast<int>(got.requestedHandleTypes),
              static_cast<int>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  } else {
    EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, try_create(&h, gran(), prop));
  }
}

// Sim: sim_posix_fd:false and sim_rdma:false turn attributes 103 and 110 off, and cuMemCreate
// then refuses what they no longer allow; the defaults are on.
TEST_P(Conformance, SimDeviceAttributesFollowConfiguration) {
  CONFORMANCE_REQUIRE_SIM("needs sim_posix_fd and sim_rdma");
  EXPECT_EQ(attribute(t(), CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                      dev(0)), 1);
  EXPECT_EQ(attribute(t(), CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev(0)),
            1);
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_posix_fd:false,sim_rdma:false"));
  EXPECT_EQ(attribute(t(), CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                      dev(1)), 0);
  EXPECT_EQ(attribute(t(), CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev(1)),
            0);
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = device_prop(0);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, try_create(&h, gran(), prop));
  prop = device_prop(0);
  prop.allocFlags.gpuDirectRDMACapable = 1;
  EXPECT_CU(CUDA_ERROR_NOT_SUPPORTED, try_create(&h, gran(), prop));
  EXPECT_CU(CUDA_SUCCESS, try_create(&h, gran(), device_prop(0)));
}

// Sim: sim_driver_version:12020 (a 535-series driver): cuDriverGetVersion says so, the driver's
// cuGetProcAddress knows nothing newer (a symbol introduced later is SYMBOL_NOT_FOUND, a base
// name answers with its newest older variant, a cudaVersion above the driver is INVALID_VALUE),
// and the loader leaves the optional entry points newer than 12.2 out.
TEST_P(Conformance, OlderDriverVersionHidesNewerEntryPoints) {
  CONFORMANCE_REQUIRE_SIM("needs sim_driver_version");
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_driver_version:12020"));
  int version = 0;
  EXPECT_CU(CUDA_SUCCESS, t().driver_get_version(&version));
  EXPECT_EQ(version, 12020);
  using Gpa = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  Gpa gpa = library_path().empty()
                ? &sim::sim_get_proc_address
                : reinterpret_cast<Gpa>(library_symbol("cuGetProcAddress_v2"));
  ASSERT_NE(gpa, nullptr);
  void* fn = reinterpret_cast<void*>(0x1);
  auto status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_CU(CUDA_SUCCESS, gpa("cuStreamGetDevice", &fn, 12020, 0, &status));  // 12.8
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, gpa("cuStreamGetCaptureInfo", &fn, 12030, 0, &status));
  EXPECT_CU(CUDA_SUCCESS, gpa("cuStreamGetCaptureInfo", &fn, 12020, 0, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  if (!library_path().empty()) {
    EXPECT_EQ(fn, library_symbol("cuStreamGetCaptureInfo_v2")) << "the 11.3 variant, not _v3";
  } else {
    EXPECT_EQ(fn, reinterpret_cast<void*>(&sim::sim_stream_get_capture_info_v2));
  }
  EXPECT_CU(CUDA_SUCCESS, gpa("cuStreamGetId", &fn, 12020, 0, &status));
  EXPECT_NE(fn, nullptr) << "12.0 entry points are there";

  // The loader, on that driver.
  std::unique_ptr<driver::LoadedDriver> old;
  if (library_path().empty()) {
    sim::SimConfig cfg = sim::sim_config_from_string(std::string(kSimConf) +
                                                     ",sim_driver_version:12020");
    old = driver::load_sim(cfg, "test");
  } else {
    old = driver::load_cuda(library_path());
  }
  EXPECT_EQ(old->driver_version(), 12020);
  EXPECT_FALSE(old->has(driver::EntryPoint::stream_get_capture_info));
  EXPECT_FALSE(old->has(driver::EntryPoint::stream_get_device));
  EXPECT_TRUE(old->has(driver::EntryPoint::stream_get_id));
  EXPECT_TRUE(old->has(driver::EntryPoint::stream_is_capturing));
  const auto missing = old->missing();
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0], driver::EntryPoint::stream_get_device);
  EXPECT_EQ(missing[1], driver::EntryPoint::stream_get_capture_info);
}

}  // namespace
}  // namespace expanse::conformance

namespace expanse::conformance {
namespace {

// Sim: a driver older than a required entry point (CUDA 10.2 lacks the 11.0
// cuDevicePrimaryCtxRelease_v2) cannot be loaded, and the error names what is missing.
TEST_P(Conformance, DriverOlderThanARequiredEntryPointIsRefused) {
  CONFORMANCE_REQUIRE_SIM("needs sim_driver_version");
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_driver_version:10020"));
  try {
    if (library_path().empty()) {
      driver::load_sim(
          sim::sim_config_from_string(std::string(kSimConf) + ",sim_driver_version:10020"), "test");
    } else {
      driver::load_cuda(library_path());
    }
    ADD_FAILURE() << "a 10.2 driver was loaded";
  } catch (const driver::driver_error& e) {
    EXPECT_NE(std::string(e.what()).find("cuDevicePrimaryCtxRelease_v2"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("10.2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace expanse::conformance

namespace expanse::conformance {
namespace {

// Sim: sim_rdma:wsl is WSL2's driver (pytorch/pytorch#192330): attribute 110 says 1, cuMemCreate
// and cuMemMap accept allocFlags.gpuDirectRDMACapable, and cuMemSetAccess on that memory returns
// CUDA_ERROR_UNKNOWN (memory created without the flag still works).
TEST_P(Conformance, WslRdmaFailsSetAccessOnRdmaCapableMemory) {
  CONFORMANCE_REQUIRE_SIM("needs sim_rdma:wsl");
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_rdma:wsl"));
  EXPECT_EQ(attribute(t(), CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev(0)),
            1);
  make_current();
  CUmemAllocationProp prop = device_prop(0);
  prop.allocFlags.gpuDirectRDMACapable = 1;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(CUDA_SUCCESS, try_create(&h, gran(), prop));
  const CUdeviceptr va = reserve(2 * gran());
  ASSERT_CU(CUDA_SUCCESS, try_map(va, gran(), 0, h));
  EXPECT_CU(CUDA_ERROR_UNKNOWN, set_access(va, gran()));
  EXPECT_EQ(get_access(va), 0u) << "the failed call granted nothing";
  // Plain memory next to it is unaffected; a range covering both fails as a whole.
  const CUmemGenericAllocationHandle plain = create(gran());
  map(va + gran(), gran(), plain);
  EXPECT_CU(CUDA_ERROR_UNKNOWN, set_access(va, 2 * gran()));
  EXPECT_EQ(get_access(va + gran()), 0u);
  EXPECT_CU(CUDA_SUCCESS, set_access(va + gran(), gran()));
  EXPECT_EQ(get_access(va + gran()),
            static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
}

// Sim: sim_rdma still takes only a boolean or wsl.
TEST_P(Conformance, SimRdmaRejectsOtherValues) {
  CONFORMANCE_REQUIRE_SIM("needs sim_rdma");
  EXPECT_NE(hooks()->reset_with("sim_rdma:wsl2"), "");
  EXPECT_EQ(hooks()->reset_with("sim_rdma:false"), "");
}

}  // namespace
}  // namespace expanse::conformance
