// expanse_torch_malloc / expanse_torch_free through dlopen(RTLD_LOCAL) + dlsym, as
// CUDAPluggableAllocator reaches them (ctypes.CDLL loads the library RTLD_LOCAL). The test does
// not link libexpanse: the exception thrown inside it is caught here, in another module, as
// std::exception, which is what PyTorch's bindings catch.
#include "expanse/expanse.h"

#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using alloc_fn_t = void* (*)(size_t, int, struct CUstream_st*);
using free_fn_t = void (*)(void*, size_t, int, struct CUstream_st*);

template <typename F>
F lookup(void* lib, const char* name) {
  void* sym = dlsym(lib, name);
  F out = nullptr;
  if (sym != nullptr) std::memcpy(&out, &sym, sizeof(out));
  return out;
}

struct Lib {
  void* handle = nullptr;
  std::string error;
  alloc_fn_t torch_malloc = nullptr;
  free_fn_t torch_free = nullptr;
  int (*init)(const char*) = nullptr;
  int (*get_stats)(int, expanse_stats*) = nullptr;
  int (*release_cached)(int) = nullptr;
  const char* (*last_error)() = nullptr;

  Lib() {
    handle = dlopen(EXPANSE_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error = dlerror();
      return;
    }
    torch_malloc = lookup<alloc_fn_t>(handle, "expanse_torch_malloc");
    torch_free = lookup<free_fn_t>(handle, "expanse_torch_free");
    init = lookup<decltype(init)>(handle, "expanse_init");
    get_stats = lookup<decltype(get_stats)>(handle, "expanse_get_stats");
    release_cached = lookup<decltype(release_cached)>(handle, "expanse_release_cached");
    last_error = lookup<decltype(last_error)>(handle, "expanse_last_error");
  }
  expanse_stats stats() const {
    expanse_stats s{};
    s.struct_size = sizeof s;
    EXPECT_EQ(get_stats(0, &s), EXPANSE_OK) << last_error();
    return s;
  }
};

Lib& lib() {
  static Lib l;
  return l;
}

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

class TorchEntryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(lib().handle, nullptr) << lib().error;
    ASSERT_NE(lib().torch_malloc, nullptr);
    ASSERT_NE(lib().torch_free, nullptr);
    // A 1 GiB sim device, whatever EXPANSE_CONF says.
    ASSERT_EQ(lib().init("driver:sim,sim_capacity:1GiB"), EXPANSE_OK) << lib().last_error();
  }
  void TearDown() override { EXPECT_EQ(lib().stats().live_blocks, 0u); }
};

TEST_F(TorchEntryTest, OomThrowsTorchMessageAcrossDlopenAndLaterAllocationsWork) {
  void* held = lib().torch_malloc(256 * MiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  bool caught = false;
  std::string what;
  try {
    (void)lib().torch_malloc(2 * GiB, 0, nullptr);  // more than the device holds
  } catch (const std::exception& e) {
    caught = true;
    what = e.what();
  }
  ASSERT_TRUE(caught) << "expanse_torch_malloc did not throw for 2 GiB on a 1 GiB device";
  EXPECT_EQ(what.rfind("CUDA out of memory. Tried to allocate 2.00 GiB.", 0), 0u) << what;
  // PyTorch's format_size prints sizes up to 1 GiB in MiB.
  EXPECT_NE(what.find("GPU 0 has a total capacity of 1024.00 MiB"), std::string::npos) << what;
  EXPECT_NE(what.find("expanse: out of memory on device 0"), std::string::npos) << what;
  EXPECT_EQ(lib().stats().num_ooms, 1u);

  // A request that fits only once the first block is gone: fails, then works after the free.
  EXPECT_THROW((void)lib().torch_malloc(900 * MiB, 0, nullptr), std::runtime_error);
  lib().torch_free(held, 256 * MiB, 0, nullptr);
  void* big = lib().torch_malloc(900 * MiB, 0, nullptr);
  ASSERT_NE(big, nullptr);
  lib().torch_free(big, 900 * MiB, 0, nullptr);
}

TEST_F(TorchEntryTest, SizeZeroIsNullWithoutThrowing) {
  EXPECT_EQ(lib().torch_malloc(0, 0, nullptr), nullptr);
  lib().torch_free(nullptr, 0, 0, nullptr);
}

TEST_F(TorchEntryTest, UsageErrorsThrowTheirOwnMessage) {
  try {
    (void)lib().torch_malloc(MiB, 7, nullptr);
    FAIL() << "no exception for device 7";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("CUDA out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("device 7 does not exist"), std::string::npos) << what;
  }
}

TEST_F(TorchEntryTest, WrongSizeFreesByPointerAndIsCounted) {
  const uint64_t before = lib().stats().num_free_size_mismatches;
  void* a = lib().torch_malloc(3 * MiB + 5, 0, nullptr);
  void* b = lib().torch_malloc(1000, 0, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  lib().torch_free(a, 4 * MiB, 0, nullptr);  // a stale size, as PyTorch #153109
  lib().torch_free(b, 999, 1, nullptr);      // wrong size and wrong device: still freed
  const expanse_stats s = lib().stats();
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.requested_bytes, 0u);
  EXPECT_EQ(s.num_free_size_mismatches, before + 2);
}

TEST_F(TorchEntryTest, UnknownPointerIsIgnoredAndCounted) {
  const uint64_t before = lib().stats().num_unknown_frees;
  void* a = lib().torch_malloc(MiB, 0, nullptr);
  ASSERT_NE(a, nullptr);
  lib().torch_free(a, MiB, 0, nullptr);
  lib().torch_free(a, MiB, 0, nullptr);  // double free: reported, nothing changes
  int local = 0;
  lib().torch_free(&local, 4, 0, nullptr);  // foreign
  const expanse_stats s = lib().stats();
  EXPECT_EQ(s.num_unknown_frees, before + 2);
  EXPECT_EQ(s.num_frees, 1u);
}

// The OOM exception is caught by its base classes too, and its dynamic type has default
// visibility, so catching it in another module never falls through to std::terminate.
TEST_F(TorchEntryTest, ExceptionTypeInformationIsExported) {
  void* ti = dlsym(lib().handle, "_ZTIN7expanse3api11torch_errorE");
  EXPECT_NE(ti, nullptr) << "typeinfo for expanse::api::torch_error is not exported";
  try {
    (void)lib().torch_malloc(4 * GiB, 0, nullptr);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("CUDA out of memory. Tried to allocate 4.00 GiB.", 0), 0u);
  }
}

}  // namespace
