// Rules for cuGetProcAddress_v2 (spec §1.3, §7 #33-#35), called directly on the loaded library.
// They need a dlopen'ed library: sim_dlopen, and the real driver when there is one.
#include "conformance.hpp"

#include "driver/entry_points.hpp"

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

// §1.3 / §7 #33: an unknown symbol is SUCCESS with pfn = NULL and SYMBOL_NOT_FOUND.
TEST_P(Conformance, ProcAddressUnknownSymbolIsSuccessWithNull) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get) << library_path() << " does not export cuGetProcAddress_v2";
  void* pfn = reinterpret_cast<void*>(0x1);
  auto status = bad_enum<CUdriverProcAddressQueryResult>(0x7);
  EXPECT_CU(CUDA_SUCCESS, get("cuExpanseNoSuchFunction", &pfn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // symbolStatus is optional.
  pfn = reinterpret_cast<void*>(0x1);
  EXPECT_CU(CUDA_SUCCESS, get("cuExpanseNoSuchFunction", &pfn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  EXPECT_EQ(pfn, nullptr);
}

// §1.3 / §7 #34: a known symbol asked for at a version before it existed is SUCCESS with
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

// §1.3 / §7 #35: a cudaVersion above the driver's version is INVALID_VALUE.
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

// §1.3: the variant returned is the newest whose version ≤ cudaVersion: cuMemGetInfo at 3020+
// is cuMemGetInfo_v2 (size_t), at 2000 the legacy unsigned-int one; the same for
// cuStreamDestroy/_v2 (4000).
TEST_P(Conformance, ProcAddressPicksAbiVariantByVersion) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  struct Case {
    const char* base;
    int old_version;
    const char* old_symbol;
    int new_version;
    const char* new_symbol;
  };
  const Case cases[] = {
      {"cuMemGetInfo", 2000, "cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
      {"cuStreamDestroy", 2000, "cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
      {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease", 11000,
       "cuDevicePrimaryCtxRelease_v2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.base);
    void* old_fn = nullptr;
    void* new_fn = nullptr;
    void* latest_fn = nullptr;
    auto status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_CU(CUDA_SUCCESS, get(c.base, &old_fn, c.old_version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_CU(CUDA_SUCCESS, get(c.base, &new_fn, c.new_version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    EXPECT_CU(CUDA_SUCCESS, get(c.base, &latest_fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    ASSERT_NE(old_fn, nullptr);
    ASSERT_NE(new_fn, nullptr);
    EXPECT_NE(old_fn, new_fn) << "the legacy ABI and the new ABI are different functions";
    EXPECT_EQ(latest_fn, new_fn);
    if (hooks() != nullptr) {
      // The sim hands out its exported functions.
      EXPECT_EQ(old_fn, library_symbol(c.old_symbol));
      EXPECT_EQ(new_fn, library_symbol(c.new_symbol));
    }
  }
}

// §1.3: every entry point the project uses resolves at the version it is called with, to the
// exported symbol of that ABI (on the sim).
TEST_P(Conformance, ProcAddressResolvesEveryEntryPoint) {
  CONFORMANCE_REQUIRE_LIBRARY();
  const ProcAddress get(library_symbol("cuGetProcAddress_v2"));
  ASSERT_TRUE(get);
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    SCOPED_TRACE(driver::entry_point_name(e));
    void* fn = nullptr;
    auto status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_CU(CUDA_SUCCESS, get(driver::entry_point_name(e), &fn, driver::entry_point_version(e),
                                CU_GET_PROC_ADDRESS_DEFAULT, &status));
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_NE(fn, nullptr);
    if (hooks() != nullptr) {
      EXPECT_EQ(fn, library_symbol(driver::entry_point_symbol(e)));
    }
  }
}

// §1.3: cuGetProcAddress works before cuInit (the CUDA runtime calls it first).
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
  EXPECT_EQ(fn, library_symbol("cuInit"));
  EXPECT_CU(CUDA_SUCCESS, t().init(0));
}

}  // namespace
}  // namespace expanse::conformance
