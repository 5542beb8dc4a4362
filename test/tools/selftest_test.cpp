// `expanse selftest`: its JSON against libexpanse_simcuda.so loaded as the driver (the real-driver
// path end to end), and drivers that break a rule or fail a call making the matching check fail.
#include "selftest.hpp"
#include "tools_test_util.hpp"

#include "driver/driver.hpp"
#include "sim/sim.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace expanse::test {
namespace {

using Json = nlohmann::json;
using tools::CheckResult;
using tools::SelftestReport;

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr uint64_t GiB = uint64_t{1} << 30;

const std::string kSimLibrary = std::string(EXPANSE_BUILD_LIB_DIR) + "/libexpanse_simcuda.so";

const CheckResult* find_check(const SelftestReport& r, const std::string& name) {
  for (const CheckResult& c : r.checks) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// Small and quick: the checks and a short calibration, no stress.
tools::SelftestOptions quick(const std::string& conf) {
  tools::SelftestOptions o;
  o.conf = conf;
  o.repetitions = 1;
  o.max_handle = 8 * MiB;
  o.max_range = 4;
  o.stress = false;
  return o;
}

TEST(Selftest, JsonAgainstTheSimLibraryAsTheDriver) {
  TempDir dir;
  const std::string report = dir.path() + "/report.json";
  RunResult r = run_expanse("selftest --json --report '" + report + "'",
                            "driver:cuda,driver_library:" + kSimLibrary + ",sim_capacity:4GiB");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  Json j = Json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  EXPECT_EQ(Json::parse(read_file(report)), j) << "--report writes the same object";
  std::remove(report.c_str());

  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["driver_kind"], "cuda");
  EXPECT_NE(j["driver"].get<std::string>().find("libexpanse_simcuda.so"), std::string::npos);
  EXPECT_FALSE(j["device"].get<std::string>().empty());
  EXPECT_EQ(j["driver_version"], "13.0");
  EXPECT_EQ(j["granularity_bytes"].get<uint64_t>(), 2 * MiB);

  ASSERT_TRUE(j["checks"].is_array());
  EXPECT_GE(j["checks"].size(), 15u);
  for (const Json& c : j["checks"]) {
    ASSERT_TRUE(c["name"].is_string());
    ASSERT_TRUE(c["message"].is_string());
    EXPECT_TRUE(c["ok"].get<bool>()) << c["name"] << ": " << c["message"];
  }
  EXPECT_TRUE(j["stress"]["ok"].get<bool>()) << j["stress"];
  EXPECT_TRUE(j["stress"]["verified"].get<bool>());
  EXPECT_GT(j["stress"]["pages_verified"].get<uint64_t>(), 0u);

  // Every calibrated entry point: at least six handle sizes, the granularity to 1 GiB.
  const Json& t = j["cost_table"];
  for (const char* e : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                        "cuMemAddressReserve"}) {
    ASSERT_TRUE(t.contains(e)) << e;
    const Json& s = t[e];
    ASSERT_GE(s.size(), 6u) << e;
    EXPECT_EQ(s.front()["bytes"].get<uint64_t>(), 2 * MiB) << e;
    EXPECT_EQ(s.back()["bytes"].get<uint64_t>(), GiB) << e;
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_GE(s[i]["seconds"].get<double>(), 0.0) << e;
      if (i > 0) {
        EXPECT_GT(s[i]["bytes"].get<uint64_t>(), s[i - 1]["bytes"].get<uint64_t>());
      }
    }
  }
  // Ranges of 1 .. 512 mappings for cuMemSetAccess and cuMemUnmap.
  ASSERT_TRUE(t["ranges"].is_array());
  size_t unmap = 0, access = 0;
  for (const Json& x : t["ranges"]) {
    const std::string e = x["entry_point"];
    EXPECT_EQ(x["mapping_bytes"].get<uint64_t>(), 2 * MiB);
    EXPECT_GE(x["seconds"].get<double>(), 0.0);
    if (e == "cuMemUnmap") ++unmap;
    if (e == "cuMemSetAccess") ++access;
    EXPECT_TRUE(e == "cuMemUnmap" || e == "cuMemSetAccess") << e;
  }
  EXPECT_EQ(unmap, 10u);  // 1, 2, 4, ..., 512
  EXPECT_EQ(access, 10u);

  // The text form names every check and the verdict.
  r = run_expanse("selftest --repetitions 1",
                  "driver:cuda,driver_library:" + kSimLibrary + ",sim_capacity:2GiB");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok    unmap_partial_fails"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("result: PASS"), std::string::npos) << r.out;
}

// ---- drivers that break a rule ----------------------------------------------------------------

CUresult (*g_real_create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long) = nullptr;
CUresult (*g_real_dtoh)(void*, CUdeviceptr, size_t) = nullptr;
CUresult (*g_real_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long) = nullptr;
CUresult (*g_real_unmap)(CUdeviceptr, size_t) = nullptr;
CUresult (*g_real_retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
CUresult (*g_real_release)(CUmemGenericAllocationHandle) = nullptr;

bool page_mapped(CUdeviceptr va) {
  CUmemGenericAllocationHandle h = 0;
  if (g_real_retain(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(va))) != CUDA_SUCCESS)
    return false;
  g_real_release(h);
  return true;
}

// The code the sim gave before it was measured on a real H100: INVALID_VALUE for an offset.
CUresult invalid_value_offset_map(CUdeviceptr p, size_t size, size_t offset,
                                  CUmemGenericAllocationHandle h, unsigned long long flags) {
  if (offset != 0) return CUDA_ERROR_INVALID_VALUE;
  return g_real_map(p, size, offset, h, flags);
}

// Refuses a range that starts on a page never mapped (the sim's old rule).
CUresult strict_unmap(CUdeviceptr p, size_t size) {
  if (!page_mapped(p)) return CUDA_ERROR_INVALID_VALUE;
  return g_real_unmap(p, size);
}

// Says SUCCESS but unmaps nothing where the range ends on a page never mapped.
CUresult lazy_unmap(CUdeviceptr p, size_t size) {
  if (size != 0 && !page_mapped(p + size - 1)) return CUDA_SUCCESS;
  return g_real_unmap(p, size);
}

// Accepts any size, rounding it up to the granularity (2 MiB), as a lax driver might.
CUresult lenient_create(CUmemGenericAllocationHandle* h, size_t size,
                        const CUmemAllocationProp* p, unsigned long long flags) {
  const size_t g = 2 * MiB;
  return g_real_create(h, (size + g - 1) / g * g, p, flags);
}

// Flips one bit of every 8-byte read.
CUresult corrupting_dtoh(void* dst, CUdeviceptr src, size_t n) {
  const CUresult r = g_real_dtoh(dst, src, n);
  if (r == CUDA_SUCCESS && n == 8) *static_cast<unsigned char*>(dst) ^= 1;
  return r;
}

class SelftestBrokenDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::SimConfig cfg;
    cfg.capacity = 4 * GiB;
    sim_ = driver::load_sim(cfg, "test");
    table_ = sim_->table();
    g_real_create = table_.mem_create;
    g_real_dtoh = table_.memcpy_dtoh;
    g_real_map = table_.mem_map;
    g_real_unmap = table_.mem_unmap;
    g_real_retain = table_.mem_retain_allocation_handle;
    g_real_release = table_.mem_release;
  }
  SelftestReport run(const char* description) {
    driver::LoadedDriver broken(table_, driver::DriverKind::cuda, description, nullptr);
    return tools::run_selftest(broken, quick(""));
  }
  // Every check but `name` passes; `name` fails with a message holding each of `words`.
  void expect_only_failure(const SelftestReport& r, const std::string& name,
                           std::initializer_list<const char*> words) {
    EXPECT_FALSE(r.ok());
    for (const CheckResult& c : r.checks) {
      if (c.name == name) continue;
      EXPECT_TRUE(c.ok) << c.name << ": " << c.message;
    }
    const CheckResult* c = find_check(r, name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_FALSE(c->ok);
    for (const char* w : words) EXPECT_NE(c->message.find(w), std::string::npos) << c->message;
    // Nothing left behind by the failed check.
    EXPECT_TRUE(sim::outstanding().empty()) << sim::describe_outstanding();
  }

  std::unique_ptr<driver::LoadedDriver> sim_;
  driver::DriverTable table_;
};

TEST_F(SelftestBrokenDriver, TheSimUnchangedPassesEveryCheck) {
  const SelftestReport r = run("sim");
  for (const CheckResult& c : r.checks) EXPECT_TRUE(c.ok) << c.name << ": " << c.message;
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(sim::outstanding().empty()) << sim::describe_outstanding();
}

TEST_F(SelftestBrokenDriver, CreateAcceptingAnUnalignedSizeFailsItsCheck) {
  table_.mem_create = lenient_create;
  const SelftestReport r = run("sim with a lenient cuMemCreate");
  expect_only_failure(r, "create_rejects_unaligned_size",
                      {"cuMemCreate(3 MiB", "returned CUDA_SUCCESS",
                       "expected CUDA_ERROR_INVALID_VALUE"});
  Json j = tools::selftest_json(r);
  EXPECT_FALSE(j["ok"].get<bool>());
}

// The real driver's codes (measured on H100, driver 580.159.04, 2026-11-23) are what the checks
// expect; a driver answering as the sim used to fails the matching check.
TEST_F(SelftestBrokenDriver, MapOffsetAnsweredInvalidValueFailsItsCheck) {
  table_.mem_map = invalid_value_offset_map;
  const SelftestReport r = run("sim with INVALID_VALUE for a map offset");
  expect_only_failure(r, "map_offset_must_be_zero",
                      {"offset 2 MiB", "returned CUDA_ERROR_INVALID_VALUE",
                       "expected CUDA_ERROR_NOT_SUPPORTED"});
}

TEST_F(SelftestBrokenDriver, UnmapRefusingAPageNeverMappedFailsItsCheck) {
  table_.mem_unmap = strict_unmap;
  const SelftestReport r = run("sim refusing to unmap a page never mapped");
  expect_only_failure(r, "unmap_skips_unmapped",
                      {"a reserved page never mapped", "returned CUDA_ERROR_INVALID_VALUE",
                       "expected CUDA_SUCCESS"});
}

TEST_F(SelftestBrokenDriver, UnmapThatLeavesTheMappingBesideAHoleFailsItsCheck) {
  table_.mem_unmap = lazy_unmap;
  const SelftestReport r = run("sim whose unmap over a hole unmaps nothing");
  expect_only_failure(r, "unmap_skips_unmapped", {"left the mapping in place"});
}

TEST_F(SelftestBrokenDriver, CopiesThatCorruptDataFailTheDataChecks) {
  table_.memcpy_dtoh = corrupting_dtoh;
  const SelftestReport r = run("sim with a corrupting cuMemcpyDtoH");
  EXPECT_FALSE(r.ok());
  const CheckResult* c = find_check(r, "data_round_trip");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->ok);
  EXPECT_NE(c->message.find("page 0 head reads 0x"), std::string::npos) << c->message;
  EXPECT_NE(c->message.find(", wrote 0x"), std::string::npos) << c->message;
  EXPECT_TRUE(sim::outstanding().empty()) << sim::describe_outstanding();
}

// A failure injected through libexpanse_simcuda.so's control functions reaches the check that
// made the call, named with the entry point and the code.
TEST(Selftest, FailureInjectedThroughTheSimLibraryFailsTheMatchingCheck) {
  void* lib = dlopen(kSimLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using Configure = int (*)(const char*);
  using Inject = int (*)(const char*, unsigned long long, int);
  using Clear = void (*)();
  auto configure = reinterpret_cast<Configure>(dlsym(lib, "expanse_sim_configure"));
  auto inject = reinterpret_cast<Inject>(dlsym(lib, "expanse_sim_inject_failure"));
  auto clear = reinterpret_cast<Clear>(dlsym(lib, "expanse_sim_clear_injections"));
  ASSERT_TRUE(configure != nullptr && inject != nullptr && clear != nullptr);
  ASSERT_EQ(configure("sim_capacity:4GiB"), 0);
  // The selftest's first cuEventRecord is in the streams-and-events check.
  ASSERT_EQ(inject("cuEventRecord", 1, CUDA_ERROR_UNKNOWN), 0);
  const SelftestReport r = tools::run_selftest(quick("driver:cuda,driver_library:" + kSimLibrary));
  clear();
  EXPECT_FALSE(r.ok());
  for (const CheckResult& c : r.checks) {
    if (c.name != "streams_and_events") {
      EXPECT_TRUE(c.ok) << c.name << ": " << c.message;
    }
  }
  const CheckResult* c = find_check(r, "streams_and_events");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->ok);
  EXPECT_EQ(c->message, "cuEventRecord failed: CUDA_ERROR_UNKNOWN");
  dlclose(lib);
}

}  // namespace
}  // namespace expanse::test

namespace expanse::test {
namespace {

double modeled(const RunResult& r) {
  Json j = Json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
  return j.is_discarded() ? -1 : j["modeled_driver_seconds"].get<double>();
}

// --cost-table prices the calls of stress and replay; a bad table is exit 2, named.
TEST(Selftest, StressAndReplayPriceCallsWithACostTable) {
  TempDir dir;
  // Every VMM call a full second: far above the built-in table.
  std::string table = "{";
  for (const char* e : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                        "cuMemAddressReserve"}) {
    table += std::string(table.size() > 1 ? "," : "") + "\"" + e +
             "\": [{\"bytes\": 2097152, \"seconds\": 1.0}]";
  }
  table += "}";
  const std::string f = dir.write("table.json", table);
  const std::string stress = "stress --capacity 4GiB --size 1GiB --json";
  const double builtin = modeled(run_expanse(stress));
  const double measured = modeled(run_expanse(stress + " --cost-table '" + f + "'"));
  EXPECT_GT(builtin, 0.0);
  EXPECT_GT(measured, 100 * builtin);

  const std::string replay = "replay '" + fixture("snapshot_p4.pickle") + "' --json";
  EXPECT_GT(modeled(run_expanse(replay + " --cost-table '" + f + "'")),
            100 * modeled(run_expanse(replay)));

  const std::string bad = dir.write("bad.json", R"({"cuMemMap": [{"bytes": 1}]})");
  RunResult r = run_expanse(stress + " --cost-table '" + bad + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("bad.json: cuMemMap[0]: missing \"seconds\""), std::string::npos) << r.err;
}

}  // namespace
}  // namespace expanse::test
