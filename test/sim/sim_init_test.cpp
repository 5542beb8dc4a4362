// cuInit, devices, attributes, error strings, contexts, configuration, cuGetProcAddress.
#include <stdexcept>
#include <thread>

#include "sim_test_util.hpp"

namespace expanse::sim::testing {
namespace {

class SimInit : public ::testing::Test {
 protected:
  void SetUp() override { reset(SimConfig{}); }
  void TearDown() override { reset(SimConfig{}); }
  const driver::DriverTable& t() const { return table(); }
};

TEST_F(SimInit, TableIsComplete) { EXPECT_TRUE(table().complete()) << table().first_missing(); }

TEST_F(SimInit, EverythingButErrorsAndVersionNeedsInit) {
  int n = -1;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().device_get_count(&n));
  CUdevice d = -1;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().device_get(&d, 0));
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().mem_address_reserve(&p, 2 * MiB, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = device_prop(0);
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().mem_create(&h, 2 * MiB, &prop, 0));
  size_t g = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED,
            t().mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUcontext ctx = nullptr;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().ctx_get_current(&ctx));
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().stream_query(nullptr));
  int v = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().driver_get_version(&v));
  EXPECT_EQ(13000, v);
  const char* s = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, t().get_error_name(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ("CUDA_ERROR_INVALID_VALUE", s);
  EXPECT_EQ(CUDA_SUCCESS, t().get_error_string(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ("invalid argument", s);
  // Failing calls count too.
  EXPECT_EQ(1u, call_count(driver::EntryPoint::device_get_count));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  EXPECT_EQ(CUDA_SUCCESS, sim_get_proc_address("cuMemMap", &fn, 13000, 0, &st));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st);
  EXPECT_NE(nullptr, fn);
}

TEST_F(SimInit, InitRules) {
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().init(1));
  int n = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().device_get_count(&n));
  EXPECT_EQ(CUDA_SUCCESS, t().init(0));
  EXPECT_EQ(CUDA_SUCCESS, t().init(0));  // idempotent
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_count(&n));
  EXPECT_EQ(1, n);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().device_get_count(nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().driver_get_version(nullptr));
}

TEST_F(SimInit, NoDevices) {
  SimConfig c;
  c.devices = 0;
  reset(c);
  EXPECT_EQ(CUDA_ERROR_NO_DEVICE, t().init(0));
  int n = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, t().device_get_count(&n));
}

TEST_F(SimInit, ResetRejectsImpossibleConfigs) {
  SimConfig c;
  c.granularity = 3 * MiB;
  EXPECT_THROW(reset(c), std::invalid_argument);
  c = SimConfig{};
  c.capacity = 3 * MiB;
  EXPECT_THROW(reset(c), std::invalid_argument);
  c = SimConfig{};
  c.devices = 65;
  EXPECT_THROW(reset(c), std::invalid_argument);
}

TEST_F(SimInit, Devices) {
  SimConfig c;
  c.devices = 3;
  c.capacity = 8 * GiB;
  reset(c);
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  CUdevice d = -1;
  EXPECT_EQ(CUDA_SUCCESS, t().device_get(&d, 2));
  EXPECT_NE(2, d) << "CUdevice values are not the ordinals";
  CUdevice d0 = -1;
  CUdevice d1 = -1;
  EXPECT_EQ(CUDA_SUCCESS, t().device_get(&d0, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().device_get(&d1, 1));
  EXPECT_NE(0, d0);
  EXPECT_NE(1, d1);
  EXPECT_TRUE(d0 != d1 && d1 != d && d0 != d);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_get(&d, 3));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_get(&d, -1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().device_get(nullptr, 0));
  char name[64];
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_name(name, sizeof name, d1));
  EXPECT_STREQ("expanse sim device 1", name);
  char tiny[8];
  EXPECT_EQ(CUDA_SUCCESS, t().device_get_name(tiny, sizeof tiny, d1));
  EXPECT_STREQ("expanse", tiny);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_get_name(name, sizeof name, 1));  // an ordinal
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().device_get_name(nullptr, 10, d0));
  size_t total = 0;
  EXPECT_EQ(CUDA_SUCCESS, t().device_total_mem(&total, d0));
  EXPECT_EQ(8 * GiB, total);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_total_mem(&total, 0));  // an ordinal
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().device_total_mem(nullptr, d0));
  unsigned int total32 = 0;
  EXPECT_EQ(CUDA_SUCCESS, sim_device_total_mem_v1(&total32, d0));
  EXPECT_EQ(0xFFFFFFFFu, total32);  // clamped
}

TEST_F(SimInit, Attributes) {
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  CUdevice d0 = -1;
  ASSERT_EQ(CUDA_SUCCESS, t().device_get(&d0, 0));
  auto attr = [&](CUdevice_attribute a, CUdevice dev = -1) {
    int v = -12345;
    const CUresult r = t().device_get_attribute(&v, a, dev == -1 ? d0 : dev);
    return std::make_pair(r, v);
  };
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 1),
            attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 1), attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 8), attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 0), attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 1),
            attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 1),
            attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 108), attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  EXPECT_EQ(std::make_pair(CUDA_SUCCESS, 32), attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, attr(CU_DEVICE_ATTRIBUTE_MAX).first);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, attr(as_enum<CUdevice_attribute>(0)).first);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, attr(as_enum<CUdevice_attribute>(200)).first);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, d0 + 1).first);
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0).first);  // ordinal
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            t().device_get_attribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d0));
}

TEST_F(SimInit, ErrorStrings) {
  const char* s = reinterpret_cast<const char*>(1);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().get_error_string(as_enum<CUresult>(1000), &s));
  EXPECT_EQ(nullptr, s);
  s = reinterpret_cast<const char*>(1);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().get_error_name(as_enum<CUresult>(1000), &s));
  EXPECT_EQ(nullptr, s);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().get_error_name(CUDA_SUCCESS, nullptr));
  const std::pair<CUresult, const char*> names[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
      {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
      {CUDA_ERROR_KEY_ROTATION, "CUDA_ERROR_KEY_ROTATION"},
      {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
  };
  for (const auto& [code, name] : names) {
    EXPECT_EQ(CUDA_SUCCESS, t().get_error_name(code, &s));
    EXPECT_STREQ(name, s);
  }
  EXPECT_EQ(CUDA_SUCCESS, t().get_error_string(CUDA_ERROR_NO_DEVICE, &s));
  EXPECT_STREQ("no CUDA-capable device is detected", s);
  EXPECT_EQ(CUDA_SUCCESS, t().get_error_string(CUDA_ERROR_INVALID_CONTEXT, &s));
  EXPECT_STREQ("invalid device context", s);
}

// ---- contexts -----------------------------------------------------------------------------------

class SimContext : public SimTest {};

TEST_F(SimContext, RetainDoesNotMakeCurrent) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx, dev(0)));
  EXPECT_NE(nullptr, ctx);
  CUcontext again = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&again, dev(0)));
  EXPECT_EQ(ctx, again);
  CUcontext other = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&other, dev(1)));
  EXPECT_NE(ctx, other);
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(nullptr, cur);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().device_primary_ctx_retain(nullptr, dev(0)));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_retain(&cur, dev(1) + 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_retain(&cur, 0));  // an ordinal
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().ctx_get_current(nullptr));
}

TEST_F(SimContext, ReleaseWithoutRetain) {
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().device_primary_ctx_release(dev(0)));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_release(7));
  CUcontext ctx = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx, dev(0)));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_release(0));  // an ordinal
  EXPECT_EQ(CUDA_SUCCESS, t().device_primary_ctx_release(dev(0)));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().device_primary_ctx_release(dev(0)));
  // Fully released: can no longer be made current.
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_set_current(ctx));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_push_current(ctx));
}

TEST_F(SimContext, StackAndSetCurrent) {
  CUcontext c0 = nullptr;
  CUcontext c1 = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&c0, dev(0)));
  ASSERT_EQ(CUDA_SUCCESS, t().device_primary_ctx_retain(&c1, dev(1)));
  CUcontext cur = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_pop_current(&cur));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_set_current(c0));  // empty stack: pushes
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_push_current(c1));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(c1, cur);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_set_current(c0));  // replaces the top
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(c0, cur);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_pop_current(&cur));
  EXPECT_EQ(c0, cur);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(c0, cur);                                     // the first one is still below
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_set_current(nullptr));  // pops
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(nullptr, cur);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_set_current(nullptr));  // no-op on an empty stack
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_set_current(reinterpret_cast<CUcontext>(0x1234)));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_push_current(nullptr));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_push_current(c1));
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_pop_current(nullptr));
}

TEST_F(SimContext, StackIsPerThread) {
  CUcontext c0 = make_current(0);
  CUcontext seen = reinterpret_cast<CUcontext>(1);
  std::thread([&] { table().ctx_get_current(&seen); }).join();
  EXPECT_EQ(nullptr, seen);
  CUcontext cur = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(c0, cur);
}

TEST_F(SimContext, ResetEmptiesTheStack) {
  make_current(0);
  reset(config());
  ASSERT_EQ(CUDA_SUCCESS, t().init(0));
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(nullptr, cur);
}

TEST_F(SimContext, MemGetInfoNeedsContext) {
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().mem_get_info(&free_bytes, &total));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().ctx_synchronize());
  make_current(1);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, &total));
  EXPECT_EQ(1 * GiB, free_bytes);
  EXPECT_EQ(1 * GiB, total);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));  // NULL total is fine
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, t().mem_get_info(nullptr, &total));
  // Physical memory counts on its own device only, from cuMemCreate on.
  const CUmemGenericAllocationHandle h = create(8 * MiB, 1);
  const CUmemGenericAllocationHandle h0 = create(4 * MiB, 0);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, &total));
  EXPECT_EQ(1 * GiB - 8 * MiB, free_bytes);
  unsigned int f32 = 0;
  unsigned int t32 = 0;
  EXPECT_EQ(CUDA_SUCCESS, sim_mem_get_info_v1(&f32, &t32));
  EXPECT_EQ(1 * GiB - 8 * MiB, f32);
  EXPECT_EQ(1 * GiB, t32);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_release(h0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_get_info(&free_bytes, &total));
  EXPECT_EQ(1 * GiB, free_bytes);
  EXPECT_EQ(CUDA_SUCCESS, t().ctx_synchronize());
  // Released primary context: no context any more.
  EXPECT_EQ(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().mem_get_info(&free_bytes, &total));
}

TEST_F(SimContext, StrictContextPolicyForVmm) {
  Policy p;
  p.require_context_for_vmm = true;
  set_policy(p);
  CUdeviceptr va = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, t().mem_address_reserve(&va, 2 * MiB, 0, 0, 0));
  make_current(0);
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_reserve(&va, 2 * MiB, 0, 0, 0));
  EXPECT_EQ(CUDA_SUCCESS, t().mem_address_free(va, 2 * MiB));
}

// ---- configuration ------------------------------------------------------------------------------

TEST(SimConfigParse, Keys) {
  SimConfig c = sim_config_from_string("");
  EXPECT_EQ(1, c.devices);
  EXPECT_EQ(80 * GiB, c.capacity);
  EXPECT_EQ(2 * MiB, c.granularity);
  EXPECT_TRUE(c.backing);
  c = sim_config_from_string(
      "driver:sim, sim_devices:4, sim_capacity:16GiB, sim_granularity:64KiB, sim_backing:false, "
      "page_size:2MiB");
  EXPECT_EQ(4, c.devices);
  EXPECT_EQ(16 * GiB, c.capacity);
  EXPECT_EQ(64 * KiB, c.granularity);
  EXPECT_FALSE(c.backing);
  EXPECT_EQ(0, sim_config_from_string("sim_devices:0").devices);
}

TEST(SimConfigParse, ErrorsNameTheKey) {
  auto message = [](const char* conf) -> std::string {
    try {
      sim_config_from_string(conf);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(std::string::npos, message("sim_devices:65").find("sim_devices"));
  EXPECT_NE(std::string::npos, message("sim_devices:two").find("sim_devices"));
  EXPECT_NE(std::string::npos, message("sim_capacity:0").find("sim_capacity"));
  EXPECT_NE(std::string::npos, message("sim_capacity:3MiB").find("sim_capacity"));
  EXPECT_NE(std::string::npos, message("sim_capacity:lots").find("sim_capacity"));
  EXPECT_NE(std::string::npos, message("sim_granularity:3MiB").find("sim_granularity"));
  EXPECT_NE(std::string::npos, message("sim_granularity:2KiB").find("sim_granularity"));
  EXPECT_NE(std::string::npos, message("sim_backing:maybe").find("sim_backing"));
  EXPECT_NE(std::string::npos, message("sim_bogus:1").find("sim_bogus"));
  // The default 80 GiB capacity is not a multiple of 3 GiB... but 1 GiB granularity is fine.
  EXPECT_EQ(1 * GiB, sim_config_from_string("sim_granularity:1GiB").granularity);
}

// ---- cuGetProcAddress
// -----------------------------------------------------------------------------

TEST(SimProcAddress, VersionsAndStatus) {
  reset(SimConfig{});
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  auto get = [&](const char* name, int version, cuuint64_t flags = 0) {
    fn = reinterpret_cast<void*>(1);
    return sim_get_proc_address(name, &fn, version, flags, &st);
  };
  EXPECT_EQ(CUDA_SUCCESS, get("cuMemGetInfo", 13000));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st);
  EXPECT_EQ(reinterpret_cast<void*>(&sim_mem_get_info), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuMemGetInfo", 3010));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_mem_get_info_v1), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuCtxSynchronize", 12080));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_ctx_synchronize), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuCtxSynchronize", 13000));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_ctx_synchronize_v2), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuFoo", 13000));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, st);
  EXPECT_EQ(CUDA_SUCCESS, get("cuMemCreate", 10010));
  EXPECT_EQ(nullptr, fn);
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, st);
  EXPECT_EQ(CUDA_SUCCESS, get("cuMemCreate", 10020));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_mem_create), fn);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, get("cuMemCreate", 13010));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, get("cuMemCreate", 12000, 4));
  EXPECT_EQ(CUDA_SUCCESS,
            get("cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_stream_synchronize_ptsz), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuGetProcAddress", 12000));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_get_proc_address), fn);
  EXPECT_EQ(CUDA_SUCCESS, get("cuGetProcAddress", 11030));
  EXPECT_EQ(reinterpret_cast<void*>(&sim_get_proc_address_v1), fn);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, sim_get_proc_address(nullptr, &fn, 13000, 0, nullptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, sim_get_proc_address("cuInit", nullptr, 13000, 0, nullptr));
  EXPECT_EQ(CUDA_SUCCESS, sim_get_proc_address("cuInit", &fn, 13000, 0, nullptr));  // NULL status
  // The 11.3 ABI: a missing symbol is CUDA_ERROR_NOT_FOUND.
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, sim_get_proc_address_v1("cuFoo", &fn, 13000, 0));
  EXPECT_EQ(nullptr, fn);
  // Every entry point of the table resolves at its own version to the table's function.
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    driver::DriverTable copy = table();
    EXPECT_EQ(CUDA_SUCCESS, get(driver::entry_point_name(e), driver::entry_point_version(e)));
    EXPECT_EQ(*copy.slot(e), fn) << driver::entry_point_name(e);
  }
}

// Each of the sim's other variants (sim_entry.hpp) is the answer for its base name at its own
// version, with its exported symbol's name: no two variants claim the same question.
TEST(SimProcAddress, EveryOtherVariantAnswersAtItsVersion) {
  reset(SimConfig{});
  const auto check = [](const char* base, int version, bool per_thread, void* impl,
                        const char* symbol) {
    const cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_DEFAULT;
    void* fn = nullptr;
    const char* exported = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(CUDA_SUCCESS, sim_get_proc_address(base, &fn, version, flags, &st)) << symbol;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st) << symbol;
    EXPECT_EQ(impl, fn) << symbol;
    EXPECT_EQ(CUDA_SUCCESS, sim_get_proc_symbol(base, &exported, version, flags, nullptr));
    EXPECT_STREQ(symbol, exported);
  };
#define EXPANSE_X(base, version, per_thread, impl, symbol, ...) \
  check(base, version, per_thread, reinterpret_cast<void*>(&impl), #symbol);
  EXPANSE_SIM_OTHER_VARIANTS(EXPANSE_X)
#undef EXPANSE_X
}

}  // namespace
}  // namespace expanse::sim::testing
