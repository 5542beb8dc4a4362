// libexpanse_simcuda.so: the sim under the real driver's symbol names, loaded with dlopen.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "sim/export/expanse_sim_control.h"
#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

const char* const kLibrary = EXPANSE_BUILD_LIB_DIR "/libexpanse_simcuda.so";

// The library, opened once per process (its state lives as long as the process).
class Library {
 public:
  static Library& get() {
    static Library lib;
    return lib;
  }
  void* handle() const { return handle_; }
  const std::string& error() const { return error_; }
  template <class F>
  F sym(const char* name) const {
    return reinterpret_cast<F>(dlsym(handle_, name));
  }

 private:
  Library() {
    handle_ = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) error_ = dlerror();
  }
  void* handle_ = nullptr;
  std::string error_;
};

class SimExport : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("EXPANSE_SIM_TEST_CHILD") != nullptr) GTEST_SKIP() << "child process";
    ASSERT_NE(nullptr, lib().handle()) << lib().error();
    configure_ = lib().sym<decltype(&expanse_sim_configure)>("expanse_sim_configure");
    ASSERT_NE(nullptr, configure_);
    ASSERT_EQ(0, configure_("sim_devices:2,sim_capacity:1GiB"));
    get_proc_ = lib().sym<decltype(&::cuGetProcAddress_v2)>("cuGetProcAddress_v2");
    ASSERT_NE(nullptr, get_proc_);
  }
  Library& lib() { return Library::get(); }
  template <class F>
  F proc(const char* name, int version) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(CUDA_SUCCESS, get_proc_(name, &fn, version, 0, &st)) << name;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st) << name;
    return reinterpret_cast<F>(fn);
  }
  decltype(&expanse_sim_configure) configure_ = nullptr;
  decltype(&::cuGetProcAddress_v2) get_proc_ = nullptr;
};

TEST_F(SimExport, ExportsOnlyDriverAndControlNames) {
  const char* const wanted[] = {"cuInit",
                                "cuDriverGetVersion",
                                "cuGetErrorName",
                                "cuGetErrorString",
                                "cuGetProcAddress",
                                "cuGetProcAddress_v2",
                                "cuDeviceGet",
                                "cuDeviceGetCount",
                                "cuDeviceGetAttribute",
                                "cuDeviceGetName",
                                "cuDeviceTotalMem",
                                "cuDeviceTotalMem_v2",
                                "cuDevicePrimaryCtxRetain",
                                "cuDevicePrimaryCtxRelease",
                                "cuDevicePrimaryCtxRelease_v2",
                                "cuCtxGetCurrent",
                                "cuCtxSetCurrent",
                                "cuCtxPushCurrent",
                                "cuCtxPushCurrent_v2",
                                "cuCtxPopCurrent",
                                "cuCtxPopCurrent_v2",
                                "cuCtxSynchronize",
                                "cuCtxSynchronize_v2",
                                "cuMemGetInfo",
                                "cuMemGetInfo_v2",
                                "cuMemAddressReserve",
                                "cuMemAddressFree",
                                "cuMemCreate",
                                "cuMemRelease",
                                "cuMemMap",
                                "cuMemUnmap",
                                "cuMemSetAccess",
                                "cuMemGetAccess",
                                "cuMemGetAllocationGranularity",
                                "cuMemGetAllocationPropertiesFromHandle",
                                "cuMemRetainAllocationHandle",
                                "cuStreamCreate",
                                "cuStreamDestroy",
                                "cuStreamDestroy_v2",
                                "cuStreamSynchronize",
                                "cuStreamSynchronize_ptsz",
                                "cuStreamQuery",
                                "cuStreamQuery_ptsz",
                                "cuStreamWaitEvent",
                                "cuStreamWaitEvent_ptsz",
                                "cuEventCreate",
                                "cuEventDestroy",
                                "cuEventDestroy_v2",
                                "cuEventRecord",
                                "cuEventRecord_ptsz",
                                "cuEventQuery",
                                "cuEventSynchronize",
                                "cuMemcpyHtoD_v2",
                                "cuMemcpyDtoH_v2",
                                "expanse_sim_configure",
                                "expanse_sim_last_error",
                                "expanse_sim_call_count",
                                "expanse_sim_inject_failure",
                                "expanse_sim_hold_stream",
                                "expanse_sim_release_stream",
                                "expanse_sim_outstanding",
                                "expanse_sim_modeled_seconds",
                                "expanse_sim_describe_outstanding",
                                "expanse_sim_pending_events",
                                "expanse_sim_total_calls",
                                "expanse_sim_reset_counts",
                                "expanse_sim_clear_injections"};
  for (const char* name : wanted) EXPECT_NE(nullptr, dlsym(lib().handle(), name)) << name;
  // The library's private copy of the sim is not visible.
  const char* const hidden[] = {
      "_ZN7expanse3sim5resetERKNS0_9SimConfigE", "_ZN7expanse3sim5tableEv",
      "_ZN7expanse3sim8sim_initEj",
      "_ZN7expanse4conf11parse_pairsESt17basic_string_viewIcSt11char_traitsIcEE"};
  for (const char* name : hidden) EXPECT_EQ(nullptr, dlsym(lib().handle(), name)) << name;
}

TEST_F(SimExport, VmmThroughProcAddress) {
  auto init = proc<decltype(&::cuInit)>("cuInit", 13000);
  auto retain = proc<decltype(&::cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain", 13000);
  auto set_current = proc<decltype(&::cuCtxSetCurrent)>("cuCtxSetCurrent", 13000);
  auto get_info = proc<decltype(&::cuMemGetInfo_v2)>("cuMemGetInfo", 13000);
  auto reserve_fn = proc<decltype(&::cuMemAddressReserve)>("cuMemAddressReserve", 13000);
  auto create_fn = proc<decltype(&::cuMemCreate)>("cuMemCreate", 13000);
  auto map = proc<decltype(&::cuMemMap)>("cuMemMap", 13000);
  auto set_access_fn = proc<decltype(&::cuMemSetAccess)>("cuMemSetAccess", 13000);
  auto unmap = proc<decltype(&::cuMemUnmap)>("cuMemUnmap", 13000);
  auto release = proc<decltype(&::cuMemRelease)>("cuMemRelease", 13000);
  auto free_fn = proc<decltype(&::cuMemAddressFree)>("cuMemAddressFree", 13000);
  auto device_get = proc<decltype(&::cuDeviceGet)>("cuDeviceGet", 13000);
  ASSERT_EQ(CUDA_SUCCESS, init(0));
  CUdevice d1 = -1;
  ASSERT_EQ(CUDA_SUCCESS, device_get(&d1, 1));
  CUcontext ctx = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, retain(&ctx, d1));
  ASSERT_EQ(CUDA_SUCCESS, set_current(ctx));
  CUdeviceptr va = 0;
  ASSERT_EQ(CUDA_SUCCESS, reserve_fn(&va, 4 * MiB, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = device_prop(1);
  ASSERT_EQ(CUDA_SUCCESS, create_fn(&h, 4 * MiB, &prop, 0));
  ASSERT_EQ(CUDA_SUCCESS, map(va, 4 * MiB, 0, h, 0));
  const CUmemAccessDesc rw = access(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(CUDA_SUCCESS, set_access_fn(va, 4 * MiB, &rw, 1));
  as_ptr<int>(va)[1000] = 42;
  EXPECT_EQ(42, as_ptr<int>(va)[1000]);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(CUDA_SUCCESS, get_info(&free_bytes, &total));
  EXPECT_EQ(1 * GiB, total);
  EXPECT_EQ(1 * GiB - 4 * MiB, free_bytes);
  // The legacy 32-bit cuMemGetInfo, by name and through cuGetProcAddress at an old version.
  using LegacyGetInfo = CUresult (*)(unsigned int*, unsigned int*);
  auto legacy = lib().sym<LegacyGetInfo>("cuMemGetInfo");
  ASSERT_NE(nullptr, legacy);
  unsigned int f32 = 0;
  unsigned int t32 = 0;
  EXPECT_EQ(CUDA_SUCCESS, legacy(&f32, &t32));
  EXPECT_EQ(1 * GiB - 4 * MiB, f32);
  EXPECT_EQ(1 * GiB, t32);
  auto legacy_proc = proc<LegacyGetInfo>("cuMemGetInfo", 3000);
  ASSERT_NE(nullptr, legacy_proc);
  EXPECT_EQ(CUDA_SUCCESS, legacy_proc(&f32, &t32));
  EXPECT_EQ(1 * GiB - 4 * MiB, f32);
  // Control functions.
  auto count = lib().sym<decltype(&expanse_sim_call_count)>("expanse_sim_call_count");
  auto outstanding_fn = lib().sym<decltype(&expanse_sim_outstanding)>("expanse_sim_outstanding");
  auto inject = lib().sym<decltype(&expanse_sim_inject_failure)>("expanse_sim_inject_failure");
  auto last_error = lib().sym<decltype(&expanse_sim_last_error)>("expanse_sim_last_error");
  EXPECT_EQ(1u, count("cuMemMap"));
  EXPECT_EQ(3u, count("cuMemGetInfo"));     // v2 once, legacy twice
  EXPECT_EQ(3u, count("cuMemGetInfo_v2"));  // the exported name works too
  EXPECT_EQ(0u, count("cuBogus"));
  EXPECT_NE(std::string(""), last_error());
  unsigned long long r = 0, a = 0, m = 0, b = 0;
  EXPECT_EQ(0, outstanding_fn(&r, &a, &m, &b));
  EXPECT_EQ(1u, r);
  EXPECT_EQ(1u, a);
  EXPECT_EQ(1u, m);
  EXPECT_EQ(4 * MiB, b);
  EXPECT_EQ(0, inject("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN));
  EXPECT_NE(0, inject("cuBogus", 1, CUDA_ERROR_UNKNOWN));
  EXPECT_NE(0, inject("cuMemUnmap", 0, CUDA_ERROR_UNKNOWN));
  EXPECT_EQ(CUDA_ERROR_UNKNOWN, unmap(va, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, unmap(va, 4 * MiB));
  EXPECT_EQ(CUDA_SUCCESS, release(h));
  EXPECT_EQ(CUDA_SUCCESS, free_fn(va, 4 * MiB));
  EXPECT_EQ(0, outstanding_fn(&r, &a, &m, &b));
  EXPECT_EQ(0u, r + a + m + b);
}

TEST_F(SimExport, ProcAddressReturnsTheExportedSymbols) {
  struct Case {
    const char* base;
    int version;
    cuuint64_t flags;
    const char* symbol;
  };
  const Case cases[] = {
      {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
      {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
      {"cuDeviceTotalMem", 3010, 0, "cuDeviceTotalMem"},
      {"cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"},
      {"cuStreamDestroy", 3000, 0, "cuStreamDestroy"},
      {"cuStreamDestroy", 13000, 0, "cuStreamDestroy_v2"},
      {"cuEventDestroy", 2000, 0, "cuEventDestroy"},
      {"cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
      {"cuCtxPushCurrent", 2000, 0, "cuCtxPushCurrent"},
      {"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"},
      {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize"},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
      {"cuStreamSynchronize", 13000, 0, "cuStreamSynchronize"},
      {"cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuStreamSynchronize_ptsz"},
      {"cuEventRecord", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuEventRecord_ptsz"},
      {"cuEventRecord", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuEventRecord"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuMemMap", 13000, 0, "cuMemMap"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    ASSERT_EQ(CUDA_SUCCESS, get_proc_(c.base, &fn, c.version, c.flags, &st)) << c.base;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st) << c.base;
    EXPECT_EQ(dlsym(lib().handle(), c.symbol), fn) << c.base << " at " << c.version;
  }
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(CUDA_SUCCESS, get_proc_("cuNotAThing", &fn, 13000, 0, &st));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, st);
  EXPECT_EQ(CUDA_SUCCESS, get_proc_("cuMemRetainAllocationHandle", &fn, 10020, 0, &st));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, st);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, get_proc_("cuMemMap", &fn, 13020, 0, &st));
  // The 11.3 ABI.
  using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = lib().sym<GetProcV1>("cuGetProcAddress");
  ASSERT_NE(nullptr, v1);
  EXPECT_EQ(CUDA_SUCCESS, v1("cuMemUnmap", &fn, 11030, 0));
  EXPECT_EQ(dlsym(lib().handle(), "cuMemUnmap"), fn);
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, v1("cuNotAThing", &fn, 11030, 0));
  EXPECT_EQ(nullptr, fn);
}

// Every listed entry point and every other variant of the sim (sim_entry.hpp) is exported, and
// cuGetProcAddress answers its base name at its version with that export.
TEST_F(SimExport, EveryVariantIsExportedAndAnsweredAtItsVersion) {
  const auto check = [&](const char* base, int version, bool per_thread, const char* symbol) {
    void* exported = dlsym(lib().handle(), symbol);
    ASSERT_NE(nullptr, exported) << symbol;
    const cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_DEFAULT;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(CUDA_SUCCESS, get_proc_(base, &fn, version, flags, &st)) << symbol;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st) << symbol;
    EXPECT_EQ(exported, fn) << symbol;
  };
#define EXPANSE_X(field, base, symbol, version, ...) check(base, version, false, #symbol);
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
#define EXPANSE_X(base, version, per_thread, impl, symbol, ...) \
  check(base, version, per_thread, #symbol);
  EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X
}

TEST_F(SimExport, SeparateFromTheInProcessSim) {
  reset(SimConfig{});
  auto init = lib().sym<decltype(&::cuInit)>("cuInit");
  auto count = lib().sym<decltype(&::cuDeviceGetCount)>("cuDeviceGetCount");
  int n = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, count(&n));
  EXPECT_EQ(CUDA_SUCCESS, init(0));
  EXPECT_EQ(CUDA_SUCCESS, count(&n));
  EXPECT_EQ(2, n);
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, table().device_get_count(&n));  // in-process: own state
}

TEST_F(SimExport, StreamsAndHolding) {
  auto init = lib().sym<decltype(&::cuInit)>("cuInit");
  auto retain = lib().sym<decltype(&::cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  auto push = lib().sym<decltype(&::cuCtxPushCurrent_v2)>("cuCtxPushCurrent_v2");
  auto pop = lib().sym<decltype(&::cuCtxPopCurrent_v2)>("cuCtxPopCurrent_v2");
  auto stream_create = lib().sym<decltype(&::cuStreamCreate)>("cuStreamCreate");
  auto stream_destroy = lib().sym<decltype(&::cuStreamDestroy_v2)>("cuStreamDestroy_v2");
  auto event_create = lib().sym<decltype(&::cuEventCreate)>("cuEventCreate");
  auto event_record = lib().sym<decltype(&::cuEventRecord)>("cuEventRecord");
  auto event_query = lib().sym<decltype(&::cuEventQuery)>("cuEventQuery");
  auto hold = lib().sym<decltype(&expanse_sim_hold_stream)>("expanse_sim_hold_stream");
  auto release = lib().sym<decltype(&expanse_sim_release_stream)>("expanse_sim_release_stream");
  auto pending = lib().sym<decltype(&expanse_sim_pending_events)>("expanse_sim_pending_events");
  auto device_get = lib().sym<decltype(&::cuDeviceGet)>("cuDeviceGet");
  ASSERT_EQ(CUDA_SUCCESS, init(0));
  CUdevice d0 = -1;
  ASSERT_EQ(CUDA_SUCCESS, device_get(&d0, 0));
  CUcontext ctx = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, retain(&ctx, d0));
  ASSERT_EQ(CUDA_SUCCESS, push(ctx));
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, stream_create(&s, 0));
  ASSERT_EQ(CUDA_SUCCESS, event_create(&e, 0));
  hold(s);
  ASSERT_EQ(CUDA_SUCCESS, event_record(e, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, event_query(e));
  EXPECT_EQ(1u, pending());
  release(s);
  EXPECT_EQ(CUDA_SUCCESS, event_query(e));
  EXPECT_EQ(CUDA_SUCCESS, stream_destroy(s));
  // The legacy cuStreamDestroy has the same ABI.
  auto legacy_destroy = lib().sym<decltype(&::cuStreamDestroy_v2)>("cuStreamDestroy");
  EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, legacy_destroy(s));
  CUcontext popped = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, pop(&popped));
  EXPECT_EQ(ctx, popped);
}

TEST_F(SimExport, ConfigureErrors) {
  auto last_error = lib().sym<decltype(&expanse_sim_last_error)>("expanse_sim_last_error");
  EXPECT_NE(0, configure_("sim_devices:lots"));
  EXPECT_NE(std::string::npos, std::string(last_error()).find("sim_devices"));
  EXPECT_NE(0, configure_("bogus_key:1"));
  EXPECT_NE(std::string::npos, std::string(last_error()).find("bogus_key"));
}

// ---- configuration from EXPANSE_CONF, in a fresh process
// ------------------------------------------

// Runs this test binary again with only `filter` and the given EXPANSE_CONF; returns its status.
int run_child(const char* filter, const char* conf) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("EXPANSE_SIM_TEST_CHILD", "1", 1);
    setenv("EXPANSE_CONF", conf, 1);
    const std::string arg = std::string("--gtest_filter=") + filter;
    execl("/proc/self/exe", "sim_child", arg.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(SimExportEnv, ConfiguresFromEnvironment) {
  if (std::getenv("EXPANSE_SIM_TEST_CHILD") != nullptr) GTEST_SKIP() << "child process";
  EXPECT_EQ(0,
            run_child("SimExportChild.ThreeDevices", "driver:sim,sim_devices:3,sim_capacity:4GiB"));
  EXPECT_EQ(0, run_child("SimExportChild.BadConfNoDevice", "sim_devices:many"));
}

class SimExportChild : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("EXPANSE_SIM_TEST_CHILD") == nullptr) GTEST_SKIP() << "runs in a child process";
    handle_ = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(nullptr, handle_) << dlerror();
  }
  void* handle_ = nullptr;
};

TEST_F(SimExportChild, ThreeDevices) {
  auto init = reinterpret_cast<decltype(&::cuInit)>(dlsym(handle_, "cuInit"));
  auto count = reinterpret_cast<decltype(&::cuDeviceGetCount)>(dlsym(handle_, "cuDeviceGetCount"));
  auto total =
      reinterpret_cast<decltype(&::cuDeviceTotalMem_v2)>(dlsym(handle_, "cuDeviceTotalMem_v2"));
  ASSERT_EQ(CUDA_SUCCESS, init(0));
  int n = 0;
  ASSERT_EQ(CUDA_SUCCESS, count(&n));
  EXPECT_EQ(3, n);
  auto get = reinterpret_cast<decltype(&::cuDeviceGet)>(dlsym(handle_, "cuDeviceGet"));
  CUdevice d2 = -1;
  ASSERT_EQ(CUDA_SUCCESS, get(&d2, 2));
  size_t bytes = 0;
  ASSERT_EQ(CUDA_SUCCESS, total(&bytes, d2));
  EXPECT_EQ(4 * GiB, bytes);
}

TEST_F(SimExportChild, BadConfNoDevice) {
  auto init = reinterpret_cast<decltype(&::cuInit)>(dlsym(handle_, "cuInit"));
  EXPECT_EQ(CUDA_ERROR_NO_DEVICE, init(0));
}

}  // namespace
}  // namespace expanse::sim::testing
