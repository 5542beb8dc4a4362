// The driver conformance suite: one set of rules (errors, contexts, streams, the VMM calls and
// the sim's policies for what the CUDA documentation leaves undefined), checked with
// exact CUresult codes against every driver the project can load:
//
//   sim_inprocess  the in-process sim's table (expanse::driver::load_sim)
//   sim_dlopen     libexpanse_simcuda.so through the real loader (dlopen + cuGetProcAddress_v2)
//   cuda           libcuda.so.1 when it loads, cuInit succeeds and a device exists (else skipped)
//
// Tests call the driver only through the DriverTable, so the same test runs on a real GPU. The
// sim's extra controls (call counts, failure injection, held streams, outstanding state) come
// through SimHooks, which is null on the real driver; tests that need it skip there.
//
// On a real driver the suite must run to its end and show every answer the driver gave:
// - a rule that probes what the driver answers to a sequence of calls records each answer
//   (Answers) and reports every difference when it ends, adapting to what the driver did
//   instead of stopping at the first difference or cascading from it;
// - a rule whose misuse the real driver may answer with a crash runs there in a child process
//   (CONFORMANCE_ISOLATE_ON_REAL_DRIVER, isolation.hpp): a crash is one failure of that rule,
//   naming the last driver call it made; a misuse that is undefined behaviour on the real driver
//   and need not be asked of it at all stays a sim-only rule (CONFORMANCE_REQUIRE_SIM).
#pragma once

#include "driver/driver.hpp"
#include "isolation.hpp"

#include <cuda.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace expanse::conformance {

enum class Variant { sim_inprocess, sim_dlopen, cuda };
const char* variant_name(Variant v);
// gtest prints parameters with this ("GetParam() = sim_dlopen").
inline void PrintTo(Variant v, std::ostream* os) { *os << variant_name(v); }

// The sim configuration every test starts from (for both sim variants).
inline constexpr int kSimDevices = 2;
inline constexpr size_t kSimCapacity = size_t{1} << 30;     // 1 GiB per device
inline constexpr size_t kSimGranularity = size_t{2} << 20;  // 2 MiB
inline constexpr const char* kSimConf = "sim_devices:2,sim_capacity:1GiB,sim_granularity:2MiB";

struct SimOutstanding {
  unsigned long long reservations = 0;
  unsigned long long allocations = 0;
  unsigned long long mappings = 0;
  unsigned long long physical_bytes = 0;
  unsigned long long host_allocations = 0;  // pinned host memory (cuMemHostAlloc) not freed
  unsigned long long host_bytes = 0;
  bool empty() const {
    return reservations == 0 && allocations == 0 && mappings == 0 && physical_bytes == 0 &&
           host_allocations == 0;
  }
};
std::string to_string(const SimOutstanding& o);

// Sim-only controls, the same for the in-process sim and the exported C control functions.
class SimHooks {
 public:
  virtual ~SimHooks() = default;
  // A fresh sim (kSimConf) on which cuInit has not been called. Returns "" or what went wrong.
  virtual std::string reset_uninitialized() = 0;
  // The same with kSimConf plus extra keys ("sim_peer_access:false"); "" or what went wrong.
  virtual std::string reset_with(const std::string& extra) = 0;
  virtual unsigned long long call_count(const char* base_name) = 0;
  // The nth call of base_name from now on (1 = the next one) returns code, doing nothing.
  virtual void inject_failure(const char* base_name, unsigned long long nth, CUresult code) = 0;
  virtual void hold_stream(CUstream stream) = 0;
  virtual void release_stream(CUstream stream) = 0;
  virtual void release_all() = 0;
  virtual SimOutstanding outstanding() = 0;
  // Async copies / memsets skipped because their range was unmapped before they ran.
  virtual unsigned long long async_faults() = 0;
};

// A reserved, mapped, accessible block made by Conformance::make_block.
struct Block {
  CUdeviceptr ptr = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  unsigned char* host() const {
    return reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(ptr));
  }
};

// Calls a driver function with its enum parameters passed as raw ints, so misuse can pass values
// outside an enum's range (forming such a value as the C enum type is undefined behaviour, and
// UBSan reports it; the C ABI passes a C enum exactly like an int).
template <class... Params, class... Args>
CUresult call_raw(CUresult (*fn)(Params...), Args... args) {
  using Raw = CUresult (*)(std::conditional_t<std::is_enum_v<Params>, int, Params>...);
  return reinterpret_cast<Raw>(fn)(args...);
}

inline unsigned char* host_ptr(CUdeviceptr p) {
  return reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(p));
}

// "CUDA_ERROR_INVALID_VALUE (1)": readable CUresult in assertion messages.
std::string result_name(CUresult r);

// The driver's answer to each call of a probed sequence, checked against the rule's code. Every
// difference is reported when the case ends (report() or the destructor), one failure per call,
// naming it; when there is any, every answer of the case is printed in order, so one run on a
// real driver shows them all. The answer is returned for the case to adapt to (a map that the
// rule expected to be refused but that succeeded is unmapped, not mapped again).
class Answers {
 public:
  Answers() = default;
  ~Answers() { report(); }
  Answers(const Answers&) = delete;
  Answers& operator=(const Answers&) = delete;

  // Records got as the answer of the call named `call` ("cuMemMap in a GLOBAL capture"); a
  // difference is reported at the line that recorded it.
  CUresult operator()(const std::string& call, CUresult expected, CUresult got,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE());
  // Reports what is not reported yet.
  void report();
  // Every answer so far, one line each, a difference marked.
  std::string transcript() const;
  size_t differences() const;

 private:
  struct Answer {
    std::string call;
    CUresult expected;
    CUresult got;
    const char* file;
    int line;
  };
  std::vector<Answer> answers_;
  size_t reported_ = 0;
};

class Conformance : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override;
  void TearDown() override;

  const driver::DriverTable& t() const { return *table_; }
  SimHooks* hooks() const { return hooks_; }
  Variant variant() const { return GetParam(); }
  // The library path for the dlopen variants ("" in-process).
  const std::string& library_path() const { return library_path_; }
  // dlsym on the loaded driver library (dlopen variants only; nullptr otherwise).
  void* library_symbol(const char* name) const;

  // Device facts read through the table in SetUp.
  size_t gran() const { return gran_; }
  int device_count() const { return device_count_; }
  size_t total_mem(int device = 0) const;
  // The CUdevice of an ordinal (cuDeviceGet). Functions taking a CUdevice get this, never the
  // ordinal (the sim's CUdevice values differ from the ordinals); CUmemLocation.id takes the
  // ordinal.
  CUdevice dev(int ordinal) const;

  // The standard allocation properties: pinned device memory on `device`.
  static CUmemAllocationProp device_prop(int device = 0);
  static CUmemAccessDesc access_desc(int device = 0,
                                     CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  // Retains device 0's primary context (once per test) and makes it current.
  CUcontext make_current();
  // cuMemGetInfo_v2's free bytes for the current context (makes one current).
  size_t mem_free();

  // Sim state reset to "cuInit not called"; forgets every tracked resource.
  void reset_uninitialized();
  // A fresh, initialized sim configured with kSimConf plus extra keys (call first in a test).
  void reconfigure(const std::string& extra);

  // ---- tracked driver calls: whatever succeeds is undone in TearDown --------------------------
  // try_*: the driver's code, tracking the resource when it succeeded. The plain forms throw
  // (failing the test with the call and its code) unless the call succeeds.
  CUresult try_reserve(CUdeviceptr* ptr, size_t size, size_t alignment = 0, CUdeviceptr addr = 0,
                       unsigned long long flags = 0);
  CUdeviceptr reserve(size_t size, size_t alignment = 0, CUdeviceptr addr = 0);
  CUresult address_free(CUdeviceptr ptr, size_t size);

  CUresult try_create(CUmemGenericAllocationHandle* handle, size_t size,
                      const CUmemAllocationProp& prop, unsigned long long flags = 0);
  CUmemGenericAllocationHandle create(size_t size, int device = 0);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult retain(CUmemGenericAllocationHandle* handle, CUdeviceptr addr);

  CUresult try_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                   unsigned long long flags = 0);
  void map(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle h);
  CUresult unmap(CUdeviceptr ptr, size_t size);

  CUresult set_access(CUdeviceptr ptr, size_t size, int device = 0,
                      CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  unsigned long long get_access(CUdeviceptr ptr, int device = 0);

  // cuMemHostAlloc, tracked (freed in TearDown); try_ gives the code.
  CUresult try_host_alloc(void** p, size_t bytes, unsigned flags = 0);
  void* host_alloc(size_t bytes, unsigned flags = 0);
  CUresult free_host(void* p);

  CUstream make_stream(unsigned flags = 0);
  CUevent make_event(unsigned flags = 0);
  CUresult destroy_stream(CUstream s);
  CUresult destroy_event(CUevent e);

  // Two adjacent reservations of size bytes each (*a, then *b = *a + size): reserves 2*size,
  // frees it and reserves both halves at hints. False when the driver placed them elsewhere
  // (both are still tracked and freed in TearDown).
  bool reserve_adjacent(size_t size, CUdeviceptr* a, CUdeviceptr* b);

  // reserve(pages) + create(pages) + map + set_access(device 0, read-write).
  Block make_block(size_t pages);

  // Throws (failing the test) unless r is CUDA_SUCCESS.
  void must(CUresult r, const std::string& what) const;

  // On a driver without sim hooks (the real one), and not already in the child: runs this case in
  // a child process, reports its outcome as this case's and returns true (the caller returns).
  // Use through CONFORMANCE_ISOLATE_ON_REAL_DRIVER.
  bool ran_isolated();

 private:
  const driver::DriverTable* table_ = nullptr;
  SimHooks* hooks_ = nullptr;
  std::string library_path_;
  size_t gran_ = 0;
  int device_count_ = 0;
  CUcontext primary_ = nullptr;

  std::vector<std::pair<CUdeviceptr, size_t>> reservations_;
  std::vector<std::pair<CUdeviceptr, size_t>> mappings_;
  std::vector<CUmemGenericAllocationHandle> refs_;  // one entry per reference we hold
  std::vector<CUstream> streams_;
  std::vector<void*> host_allocs_;
  std::vector<CUevent> events_;
  void forget_all();
};

// Sim-only rules: the real driver has no hooks, or the rule is a sim policy for a corner the
// real driver leaves undefined.
#define CONFORMANCE_REQUIRE_SIM(why)                                   \
  do {                                                                 \
    if (hooks() == nullptr) GTEST_SKIP() << "sim-only rule: " << why;  \
  } while (0)

// First in a rule whose misuse a real driver may answer with a crash: there the rule runs in a
// child process (isolation.hpp), whose crash is one failure of the rule naming its last driver
// call; the sims answer in process (their hooks and books are checked there).
#define CONFORMANCE_ISOLATE_ON_REAL_DRIVER() \
  do {                                       \
    if (ran_isolated()) return;              \
  } while (0)

// Two adjacent reservations, or a skip when the driver (or, for the sim, the host VA layout, as
// under TSan) does not place them side by side.
#define CONFORMANCE_RESERVE_ADJACENT(size, a, b)                                          \
  do {                                                                                    \
    if (!reserve_adjacent((size), (a), (b))) {                                            \
      GTEST_SKIP() << "the driver did not place two reservations adjacently (hint not " \
                      "honored)";                                                         \
    }                                                                                     \
  } while (0)

// EXPECT_EQ on CUresults with names in the message; further context can be streamed (<<).
::testing::AssertionResult cu_result_is(const char* expected_expr, const char* call_expr,
                                        CUresult expected, CUresult got);
#define EXPECT_CU(expected, call) \
  EXPECT_PRED_FORMAT2(::expanse::conformance::cu_result_is, expected, call)
#define ASSERT_CU(expected, call) \
  ASSERT_PRED_FORMAT2(::expanse::conformance::cu_result_is, expected, call)

}  // namespace expanse::conformance
