// Rules for cuGetProcAddress_v2, called directly on the loaded library.
// They need a dlopen'ed library: sim_dlopen, and the real driver when there is one.
#include "conformance.hpp"

#include "driver_api/entry_points.hpp"

#include <vector>

namespace expanse::conformance {
namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

class ProcAddress {
 public:
  explicit ProcAddress(void* fn) : fn_(reinterpret_cast<GetProcAddressFn>(fn)) {}
  explicit operator bool() const { return fn_ != nullptr; }
  CUresult operator()(const char* symbol, void** pfn, int version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) const {
    return fn_(symbol, pfn, version, flags, status);
  }

 private:
  GetProcAddressFn fn_;
};

#define CONFORMANCE_REQUIRE_LIBRARY()                                                  \
  do {                                                                                 \
    if (library_path().empty()) GTEST_SKIP() << "needs a driver loaded with dlopen";  \
  } while (0)

// An unknown symbol is SUCCESS with pfn = NULL and SYMBOL_NOT_FOUND.
TEST_P(Conformance, ProcAddressUnknownSymbolIsSuccessWithNull) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get) << library_path() << " does not export cuGetProcAddress_v2";
  void* pfn = reinterpret_cast<void*>(0x1);
  auto status = static_cast<CUdriverProcAddressQueryResult>(3);  // none of the three
  EXPECT_CU(CUDA_SUCCESS, get("cuExpanseNoSuchFunction", &pfn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // symbolStatus is optional.
  pfn = reinterpret_cast<void*>(0x1);
  EXPECT_CU(CUDA_SUCCESS, get("cuExpanseNoSuchFunction", &pfn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  EXPECT_EQ(pfn, nullptr);
}

// A known symbol asked for at a version before it existed is SUCCESS with
// pfn = NULL and VERSION_NOT_SUFFICIENT; at its version it is found.
TEST_P(Conformance, ProcAddressVersionBeforeSymbolIsVersionNotSufficient) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  void* pfn = reinterpret_cast<void*>(0x1);
  auto status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_CU(CUDA_SUCCESS, get("cuMemCreate", &pfn, 10010, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  EXPECT_CU(CUDA_SUCCESS, get("cuMemCreate", &pfn, 10020, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_NE(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  // cuMemRetainAllocationHandle came in 11.0.
  EXPECT_CU(CUDA_SUCCESS, get("cuMemRetainAllocationHandle", &pfn, 10020, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

// A cudaVersion above the driver's version is INVALID_VALUE.
TEST_P(Conformance, ProcAddressVersionAboveDriverIsInvalidValue) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  int driver_version = 0;
  ASSERT_CU(CUDA_SUCCESS, t().driver_get_version(&driver_version));
  void* pfn = nullptr;
  auto status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            get("cuMemCreate", &pfn, driver_version + 10, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_CU(CUDA_SUCCESS, get("cuMemCreate", &pfn, driver_version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_NE(pfn, nullptr);
}

// The variant returned is the newest whose version ≤ cudaVersion. cuMemGetInfo at 3020 and
// later is cuMemGetInfo_v2 (size_t outputs); at 2000 it is the legacy ABI (unsigned int outputs)
// — observable by what the returned function writes.
TEST_P(Conformance, ProcAddressPicksAbiVariantByVersion) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  void* legacy = nullptr;
  void* v2 = nullptr;
  void* latest = nullptr;
  auto status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_CU(CUDA_SUCCESS, get("cuMemGetInfo", &legacy, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_CU(CUDA_SUCCESS, get("cuMemGetInfo", &v2, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_CU(CUDA_SUCCESS, get("cuMemGetInfo", &latest, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  ASSERT_NE(legacy, nullptr);
  ASSERT_NE(v2, nullptr);
  EXPECT_NE(legacy, v2) << "the legacy ABI and the _v2 ABI are different functions";
  EXPECT_EQ(latest, v2);

  make_current();
  size_t expected_free = 0;
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_info(&expected_free, nullptr));
  // _v2: two size_t outputs, written in full.
  size_t free_v2 = ~size_t{0};
  size_t total_v2 = ~size_t{0};
  ASSERT_CU(CUDA_SUCCESS, reinterpret_cast<CUresult (*)(size_t*, size_t*)>(v2)(&free_v2, &total_v2));
  EXPECT_EQ(total_v2, total_mem(0));
  if (hooks() != nullptr) {
    EXPECT_EQ(free_v2, expected_free);
  }
  // Legacy: two unsigned int outputs; the word after each stays untouched. (Sim only: what a real
  // driver answers through the 32-bit ABI for a device above 4 GiB is not documented.)
  if (hooks() == nullptr) return;
  unsigned int free_v1[2] = {0u, 0xA5A5A5A5u};
  unsigned int total_v1[2] = {0u, 0x5A5A5A5Au};
  ASSERT_CU(CUDA_SUCCESS, reinterpret_cast<CUresult (*)(unsigned int*, unsigned int*)>(legacy)(
                              free_v1, total_v1));
  EXPECT_EQ(free_v1[1], 0xA5A5A5A5u) << "the 2000 variant wrote past an unsigned int";
  EXPECT_EQ(total_v1[1], 0x5A5A5A5Au) << "the 2000 variant wrote past an unsigned int";
  EXPECT_EQ(free_v1[0], static_cast<unsigned int>(expected_free));
  EXPECT_EQ(total_v1[0], static_cast<unsigned int>(kSimCapacity));
}

// Every entry point the project uses resolves at the version it is called with.
TEST_P(Conformance, ProcAddressResolvesEveryEntryPoint) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  int driver_version = 0;
  ASSERT_CU(CUDA_SUCCESS, t().driver_get_version(&driver_version));
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    SCOPED_TRACE(driver::entry_point_name(e));
    // Optional entry points newer than the driver are not asked for (the loader skips them).
    if (!driver::entry_point_required(e) && driver::entry_point_version(e) > driver_version)
      continue;
    void* fn = nullptr;
    auto status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_CU(CUDA_SUCCESS, get(driver::entry_point_name(e), &fn, driver::entry_point_version(e),
                                CU_GET_PROC_ADDRESS_DEFAULT, &status));
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_NE(fn, nullptr);
  }
}

// libexpanse_simcuda.so's cuGetProcAddress hands out the library's exported functions — base
// name at a version resolves to the same pointer as dlsym of that variant's exported symbol
// (cuMemGetInfo@3020 == dlsym("cuMemGetInfo_v2"), @2000 == dlsym("cuMemGetInfo")), so both
// lookup paths reach the same code.
TEST_P(Conformance, ProcAddressReturnsTheExportedSymbols) {
  CONFORMANCE_REQUIRE_LIBRARY();
  CONFORMANCE_REQUIRE_SIM("the real driver may hand out internal entry points");
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  struct Case {
    const char* base;
    int version;
    const char* symbol;
  };
  std::vector<Case> cases = {
      {"cuMemGetInfo", 2000, "cuMemGetInfo"},
      {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
      {"cuStreamDestroy", 2000, "cuStreamDestroy"},
      {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
      {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
  };
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    cases.push_back({driver::entry_point_name(e), driver::entry_point_version(e),
                     driver::entry_point_symbol(e)});
  }
  for (const Case& c : cases) {
    void* fn = nullptr;
    ASSERT_CU(CUDA_SUCCESS, get(c.base, &fn, c.version, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
    void* exported = library_symbol(c.symbol);
    EXPECT_NE(exported, nullptr) << c.symbol << " is not exported";
    EXPECT_EQ(fn, exported) << c.base << " at " << c.version << " is not dlsym(\"" << c.symbol
                            << "\")";
  }
}

// cuGetProcAddress works before cuInit (the CUDA runtime calls it first).
TEST_P(Conformance, ProcAddressWorksBeforeCuInit) {
  CONFORMANCE_REQUIRE_LIBRARY();
  CONFORMANCE_REQUIRE_SIM("needs a driver on which cuInit has not been called");
  ASSERT_NO_FATAL_FAILURE(reset_uninitialized());
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  void* fn = nullptr;
  auto status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  EXPECT_CU(CUDA_SUCCESS, get("cuInit", &fn, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_NE(fn, nullptr);
  EXPECT_CU(CUDA_SUCCESS, t().init(0));
}

}  // namespace
}  // namespace expanse::conformance
