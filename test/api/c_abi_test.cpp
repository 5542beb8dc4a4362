// The C ABI as PyTorch and C programs use it: NULL and codes instead of exceptions, messages in
// expanse_last_error(), nothing changed by bad input.
#include "expanse/expanse.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

class CAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(expanse_init("driver:sim,sim_devices:2,sim_capacity:4GiB"), EXPANSE_OK)
        << expanse_last_error();
  }
  void TearDown() override { EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error(); }

  static expanse_stats stats(int device) {
    expanse_stats s{};
    s.struct_size = sizeof s;
    EXPECT_EQ(expanse_get_stats(device, &s), EXPANSE_OK) << expanse_last_error();
    return s;
  }
  static std::string hex(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
  }
};

TEST_F(CAbiTest, MallocWriteReadFree) {
  auto* p = static_cast<unsigned char*>(expanse_malloc(3 * MiB, 0, nullptr));
  ASSERT_NE(p, nullptr) << expanse_last_error();
  std::memset(p, 0xAB, 3 * MiB);
  EXPECT_EQ(p[3 * MiB - 1], 0xAB);
  EXPECT_EQ(stats(0).requested_bytes, 3 * MiB);
  expanse_free(p, 3 * MiB, 0, nullptr);
  EXPECT_EQ(stats(0).requested_bytes, 0u);
  EXPECT_EQ(stats(0).num_frees, 1u);
}

TEST_F(CAbiTest, ZeroSizeIsNullWithoutError) {
  EXPECT_EQ(expanse_malloc(0, 0, nullptr), nullptr);
  expanse_stats s = stats(0);
  EXPECT_EQ(s.num_ooms, 0u);
  EXPECT_EQ(s.num_allocs, 0u);
}

TEST_F(CAbiTest, FreeOfNullDoesNothing) {
  expanse_free(nullptr, 0, 0, nullptr);
  EXPECT_EQ(expanse_free_checked(nullptr, 0, 0, nullptr), EXPANSE_OK);
  EXPECT_EQ(stats(0).num_frees, 0u);
}

TEST_F(CAbiTest, DoubleFreeNamesThePointerAndChangesNothing) {
  void* p = expanse_malloc(4096, 0, nullptr);
  void* q = expanse_malloc(4096, 0, nullptr);
  expanse_free(p, 4096, 0, nullptr);
  expanse_stats before = stats(0);
  EXPECT_EQ(expanse_free_checked(p, 4096, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find(hex(p)), std::string::npos)
      << expanse_last_error();
  expanse_stats after = stats(0);
  EXPECT_EQ(before.num_frees, after.num_frees);
  EXPECT_EQ(before.allocated_bytes, after.allocated_bytes);
  expanse_free(q, 4096, 0, nullptr);
}

TEST_F(CAbiTest, WrongDeviceNamesBothDevices) {
  void* p = expanse_malloc(4096, 1, nullptr);
  ASSERT_NE(p, nullptr);
  void* q = expanse_malloc(512, 0, nullptr);  // device 0 has an allocator too
  EXPECT_EQ(expanse_free_checked(p, 4096, 0, nullptr), EXPANSE_EINVAL);
  std::string m = expanse_last_error();
  EXPECT_NE(m.find("device 0"), std::string::npos) << m;
  EXPECT_NE(m.find("allocated on device 1"), std::string::npos) << m;
  EXPECT_EQ(stats(1).live_blocks, 1u);
  expanse_free(p, 4096, 1, nullptr);
  expanse_free(q, 512, 0, nullptr);
  EXPECT_EQ(stats(1).live_blocks, 0u);
}

TEST_F(CAbiTest, WrongSizeIsRejected) {
  void* p = expanse_malloc(1000, 0, nullptr);
  EXPECT_EQ(expanse_free_checked(p, 999, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("size 999"), std::string::npos);
  EXPECT_EQ(stats(0).live_blocks, 1u);
  EXPECT_EQ(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_OK);  // 0: size unknown
}

TEST_F(CAbiTest, OutOfMemoryIsNullWithAnExplainingMessage) {
  void* p = expanse_malloc(3 * GiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(expanse_malloc(2 * GiB, 0, nullptr), nullptr);
  std::string m = expanse_last_error();
  for (const char* word : {"out of memory", "asked for 2 GiB", "capacity 4 GiB", "tried"}) {
    EXPECT_NE(m.find(word), std::string::npos) << "'" << word << "' missing from: " << m;
  }
  EXPECT_EQ(stats(0).num_ooms, 1u);
  expanse_free(p, 3 * GiB, 0, nullptr);
  void* q = expanse_malloc(2 * GiB, 0, nullptr);
  EXPECT_NE(q, nullptr);
  expanse_free(q, 2 * GiB, 0, nullptr);
}

TEST_F(CAbiTest, BadDeviceIsAnError) {
  EXPECT_EQ(expanse_malloc(512, 7, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("device 7 does not exist"), std::string::npos)
      << expanse_last_error();
  EXPECT_EQ(expanse_malloc(512, -1, nullptr), nullptr);
}

TEST_F(CAbiTest, OverflowingSizeIsAnError) {
  EXPECT_EQ(expanse_malloc(SIZE_MAX, 0, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("overflows"), std::string::npos);
}

TEST_F(CAbiTest, StatsStructCanGrow) {
  // An old caller knows only the first fields: nothing past its struct_size is written.
  unsigned char buf[sizeof(expanse_stats) + 16];
  std::memset(buf, 0x5A, sizeof buf);
  expanse_stats* s = reinterpret_cast<expanse_stats*>(buf);
  const size_t old_size = offsetof(expanse_stats, allocated_bytes);
  s->struct_size = old_size;
  void* p = expanse_malloc(1000, 0, nullptr);
  ASSERT_EQ(expanse_get_stats(0, s), EXPANSE_OK);
  EXPECT_EQ(s->requested_bytes, 1000u);
  for (size_t i = old_size; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0x5A) << "byte " << i;
  s->struct_size = 0;
  EXPECT_EQ(expanse_get_stats(0, s), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_get_stats(0, nullptr), EXPANSE_EINVAL);
  expanse_free(p, 1000, 0, nullptr);
}

TEST_F(CAbiTest, StatsNameDriverCallsPerEntryPoint) {
  void* p = expanse_malloc(8 * MiB, 0, nullptr);
  expanse_stats s = stats(0);
  ASSERT_GT(s.num_entry_points, 0u);
  uint64_t total = 0;
  bool saw_map = false;
  for (uint32_t i = 0; i < s.num_entry_points; ++i) {
    total += s.driver_calls[i];
    if (std::string(expanse_entry_point_name(static_cast<int>(i))) == "cuMemMap") {
      EXPECT_EQ(s.driver_calls[i], 1u);  // one 8 MiB handle (four 2 MiB pages)
      saw_map = true;
    }
  }
  EXPECT_TRUE(saw_map);
  EXPECT_EQ(total, s.driver_calls_total);
  EXPECT_GT(s.modeled_driver_seconds, 0.0);
  EXPECT_EQ(expanse_entry_point_name(-1), nullptr);
  EXPECT_EQ(expanse_entry_point_name(static_cast<int>(s.num_entry_points)), nullptr);
  expanse_free(p, 8 * MiB, 0, nullptr);
}

TEST_F(CAbiTest, LimitReleaseAndPeaks) {
  ASSERT_EQ(expanse_set_limit(0, 64 * MiB), EXPANSE_OK);
  EXPECT_EQ(expanse_malloc(65 * MiB, 0, nullptr), nullptr);
  void* p = expanse_malloc(64 * MiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  expanse_free(p, 64 * MiB, 0, nullptr);
  EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK);
  expanse_stats s = stats(0);
  EXPECT_EQ(s.physical_bytes, 0u);
  EXPECT_EQ(s.peak_requested_bytes, 64 * MiB);
  EXPECT_EQ(s.limit_bytes, 64 * MiB);
  EXPECT_EQ(expanse_reset_peak_stats(0), EXPANSE_OK);
  EXPECT_EQ(stats(0).peak_requested_bytes, 0u);
  EXPECT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK);
  EXPECT_EQ(stats(0).limit_bytes, UINT64_MAX);
}

TEST_F(CAbiTest, ReserveHoldsAndUnreserveGivesBack) {
  size_t got = 0;
  ASSERT_EQ(expanse_reserve(0, 3 * GiB + 1, &got), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(got, 3 * GiB);  // rounded down to pages
  expanse_stats s = stats(0);
  EXPECT_EQ(s.reserved_bytes, 3 * GiB);
  EXPECT_EQ(s.reserved_unused_bytes, 3 * GiB);
  EXPECT_EQ(s.reserve_asked_bytes, 3 * GiB);
  void* p = expanse_malloc(GiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(stats(0).reserved_unused_bytes, 2 * GiB);
  expanse_free(p, GiB, 0, nullptr);
  EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK);
  EXPECT_EQ(stats(0).physical_bytes, 3 * GiB);
  // The limit caps it.
  EXPECT_EQ(expanse_set_limit(0, 2 * GiB), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("below its reservation"), std::string::npos);
  EXPECT_EQ(expanse_reserve(0, 5 * GiB, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("more than the device"), std::string::npos);
  EXPECT_EQ(expanse_reserve(0, EXPANSE_RESERVE_FREE, &got), EXPANSE_OK);
  EXPECT_EQ(got, 4 * GiB - 512 * MiB);  // all of it, less the default margin
  EXPECT_EQ(expanse_unreserve(0), EXPANSE_OK);
  EXPECT_EQ(stats(0).physical_bytes, 0u);
  EXPECT_EQ(stats(0).reserved_bytes, 0u);
  EXPECT_EQ(expanse_unreserve(1), EXPANSE_OK);  // a device never used: nothing to do
  EXPECT_EQ(expanse_unreserve(7), EXPANSE_EINVAL);
}

TEST_F(CAbiTest, RecordStreamOfUnknownPointerIsAnError) {
  int x = 0;
  EXPECT_EQ(expanse_record_stream(&x, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("record_stream"), std::string::npos);
  void* p = expanse_malloc(512, 0, nullptr);
  EXPECT_EQ(expanse_record_stream(p, nullptr), EXPANSE_OK);
  expanse_free(p, 512, 0, nullptr);
}

TEST_F(CAbiTest, InitRefusesWhileBlocksAreLive) {
  void* p = expanse_malloc(512, 0, nullptr);
  EXPECT_EQ(expanse_init("driver:sim"), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_shutdown(), EXPANSE_EINVAL);
  expanse_free(p, 512, 0, nullptr);
}

TEST_F(CAbiTest, DescribesTheDriver) {
  const char* d = expanse_driver_description();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(std::string(d).rfind("sim:", 0), 0u) << d;
  EXPECT_EQ(expanse_device_count(), 2);
}

TEST(CAbiConfig, BadKeysAndValuesAreNamed) {
  struct Case {
    const char* conf;
    const char* needle;
  } cases[] = {
      {"driver:sim,colour:blue", "unknown key 'colour'"},
      {"driver:gpu", "'gpu' is not one of auto, cuda, sim"},
      {"driver:sim,sim_capacity:12XB", "12XB"},
      {"driver:sim,limit:1.5", "limit"},
      {"driver:sim,page_size", "not key:value"},
      {"driver:sim,driver:sim", "given twice"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(expanse_init(c.conf), EXPANSE_EINVAL) << c.conf;
    EXPECT_NE(std::string(expanse_last_error()).find(c.needle), std::string::npos)
        << c.conf << " -> " << expanse_last_error();
  }
  expanse_shutdown();
}

TEST(CAbiConfig, NoGpuMeansAClearErrorNotSilentHostMemory) {
  // With no libcuda.so.1, driver:cuda (and driver:auto, in a library) fail and say why.
  ASSERT_EQ(expanse_init("driver:cuda,driver_library:/nonexistent/libcuda.so.1"), EXPANSE_EDRIVER);
  std::string m = expanse_last_error();
  EXPECT_NE(m.find("/nonexistent/libcuda.so.1"), std::string::npos) << m;
  EXPECT_NE(m.find("driver:sim"), std::string::npos) << m;
  ASSERT_EQ(expanse_init("driver:auto,driver_library:/nonexistent/libcuda.so.1"), EXPANSE_EDRIVER);
  // Until init succeeds, calls report that failure: no silent fallback to the environment.
  EXPECT_EQ(expanse_malloc(512, 0, nullptr), nullptr);
  EXPECT_NE(std::string(expanse_last_error()).find("expanse_init failed"), std::string::npos)
      << expanse_last_error();
  expanse_shutdown();
}

// A device expanse never set up answers its stats without being set up (on a GPU that would retain
// a CUDA context there): every figure 0 but its capacity and the configured limit, page_size 0.
// The witness: a configuration that no device can be set up with.
TEST(CAbiConfig, StatsOfADeviceNeverSetUpDoNotSetItUp) {
  ASSERT_EQ(expanse_init("driver:sim,sim_devices:2,sim_capacity:4GiB,sim_granularity:2MiB,"
                         "page_size:1MiB,limit:0.5"),
            EXPANSE_OK)
      << expanse_last_error();
  expanse_stats s{};
  s.struct_size = sizeof s;
  std::memset(reinterpret_cast<unsigned char*>(&s) + sizeof(size_t), 0x5A,
              sizeof s - sizeof(size_t));
  ASSERT_EQ(expanse_get_stats(1, &s), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(s.struct_size, sizeof s);
  EXPECT_EQ(s.capacity_bytes, 4 * GiB);
  EXPECT_EQ(s.limit_bytes, 2 * GiB);
  EXPECT_EQ(s.page_size, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.peak_physical_bytes, 0u);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.driver_calls_total, 0u);
  EXPECT_GT(s.num_entry_points, 0u);
  for (uint32_t i = 0; i < s.num_entry_points; ++i) EXPECT_EQ(s.driver_calls[i], 0u) << i;
  EXPECT_EQ(expanse_reset_peak_stats(1), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_get_stats(2, &s), EXPANSE_EINVAL);  // no such device
  EXPECT_NE(std::string(expanse_last_error()).find("device 2 does not exist"), std::string::npos)
      << expanse_last_error();
  EXPECT_EQ(expanse_reset_peak_stats(2), EXPANSE_EINVAL);
  void* p = nullptr;
  EXPECT_NE(expanse_malloc_checked(&p, 4096, 1, nullptr), EXPANSE_OK);  // setting it up fails
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK);
}

TEST(CAbiConfig, FractionalLimit) {
  ASSERT_EQ(expanse_init("driver:sim,sim_capacity:4GiB,limit:0.5"), EXPANSE_OK)
      << expanse_last_error();
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_EQ(s.limit_bytes, 2 * GiB);
  EXPECT_EQ(expanse_malloc(2 * GiB + 1, 0, nullptr), nullptr);
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK);
}

}  // namespace
