#include "conformance.hpp"

#include "driver_api/error_names.hpp"
#include "sim/sim.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace expanse::conformance {

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::sim_inprocess:
      return "sim_inprocess";
    case Variant::sim_dlopen:
      return "sim_dlopen";
    case Variant::cuda:
      return "cuda";
  }
  return "?";
}

std::string to_string(const SimOutstanding& o) {
  std::ostringstream s;
  s << o.reservations << " reservations, " << o.allocations << " allocations, " << o.mappings
    << " mappings, " << o.physical_bytes << " physical bytes, " << o.host_allocations
    << " pinned host allocations (" << o.host_bytes << " bytes)";
  return s.str();
}

std::string result_name(CUresult r) {
  const char* name = driver::error_name(static_cast<int>(r));
  std::ostringstream s;
  s << (name != nullptr ? name : "CUresult") << " (" << static_cast<int>(r) << ")";
  return s.str();
}

::testing::AssertionResult cu_result_is(const char* /*expected_expr*/, const char* call_expr,
                                        CUresult expected, CUresult got) {
  if (got == expected) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call_expr << "\n  returned " << result_name(got)
                                       << "\n  expected " << result_name(expected);
}

// ---- Answers ----------------------------------------------------------------------------------

CUresult Answers::operator()(const std::string& call, CUresult expected, CUresult got,
                             const char* file, int line) {
  answers_.push_back({call, expected, got, file, line});
  return got;
}

size_t Answers::differences() const {
  size_t n = 0;
  for (const Answer& a : answers_) n += a.got != a.expected ? 1 : 0;
  return n;
}

std::string Answers::transcript() const {
  std::ostringstream s;
  for (const Answer& a : answers_) {
    s << (a.got == a.expected ? "  same  " : "  DIFF  ") << a.call << ": " << result_name(a.got);
    if (a.got != a.expected) s << ", the rule says " << result_name(a.expected);
    s << "\n";
  }
  return s.str();
}

void Answers::report() {
  bool any = false;
  for (; reported_ < answers_.size(); ++reported_) {
    const Answer& a = answers_[reported_];
    if (a.got == a.expected) continue;
    any = true;
    ADD_FAILURE_AT(a.file, a.line) << a.call << "\n  returned " << result_name(a.got)
                                   << "\n  expected " << result_name(a.expected);
  }
  if (any) std::cout << "The driver's answers, in order:\n" << transcript() << std::flush;
}

namespace {

// ---- in-process sim hooks ---------------------------------------------------------------------

sim::SimConfig suite_sim_config() {
  sim::SimConfig cfg;
  cfg.devices = kSimDevices;
  cfg.capacity = kSimCapacity;
  cfg.granularity = kSimGranularity;
  cfg.backing = true;
  return cfg;
}

driver::EntryPoint entry_point_by_name(const char* base_name) {
  for (int i = 0; i < driver::kEntryPointCount; ++i) {
    const auto e = static_cast<driver::EntryPoint>(i);
    if (std::strcmp(driver::entry_point_name(e), base_name) == 0) return e;
  }
  throw std::invalid_argument(std::string("not a driver entry point: ") + base_name);
}

class InProcessHooks final : public SimHooks {
 public:
  std::string reset_uninitialized() override {
    sim::reset(suite_sim_config());
    return "";
  }
  std::string reset_with(const std::string& extra) override {
    try {
      sim::reset(sim::sim_config_from_string(std::string(kSimConf) + "," + extra));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  unsigned long long call_count(const char* base_name) override {
    return sim::call_count(entry_point_by_name(base_name));
  }
  void inject_failure(const char* base_name, unsigned long long nth, CUresult code) override {
    sim::inject_failure(entry_point_by_name(base_name), nth, code);
  }
  void hold_stream(CUstream stream) override { sim::hold_stream(stream); }
  void release_stream(CUstream stream) override { sim::release_stream(stream); }
  void release_all() override { sim::release_all(); }
  SimOutstanding outstanding() override {
    const sim::Outstanding o = sim::outstanding();
    SimOutstanding r;
    r.reservations = o.reservations;
    r.allocations = o.allocations;
    r.mappings = o.mappings;
    r.physical_bytes = o.physical_bytes;
    r.host_allocations = o.host_allocations;
    r.host_bytes = o.host_bytes;
    return r;
  }
  unsigned long long async_faults() override { return sim::async_faults(); }
};

// ---- libexpanse_simcuda.so hooks: the exported C control functions ----------------------------

class DlopenHooks final : public SimHooks {
 public:
  // Resolves the control functions from the already-loaded library at path.
  static std::unique_ptr<DlopenHooks> open(const std::string& path, std::string* error) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
      const char* e = dlerror();
      *error = "dlopen(RTLD_NOLOAD) " + path + ": " + (e != nullptr ? e : "?");
      return nullptr;
    }
    auto h = std::unique_ptr<DlopenHooks>(new DlopenHooks(handle));
    const char* missing = nullptr;
    if (!h->resolve(&h->configure_, "expanse_sim_configure")) missing = "expanse_sim_configure";
    else if (!h->resolve(&h->last_error_, "expanse_sim_last_error"))
      missing = "expanse_sim_last_error";
    else if (!h->resolve(&h->call_count_, "expanse_sim_call_count"))
      missing = "expanse_sim_call_count";
    else if (!h->resolve(&h->inject_, "expanse_sim_inject_failure"))
      missing = "expanse_sim_inject_failure";
    else if (!h->resolve(&h->hold_, "expanse_sim_hold_stream")) missing = "expanse_sim_hold_stream";
    else if (!h->resolve(&h->release_, "expanse_sim_release_stream"))
      missing = "expanse_sim_release_stream";
    else if (!h->resolve(&h->outstanding_, "expanse_sim_outstanding"))
      missing = "expanse_sim_outstanding";
    else if (!h->resolve(&h->release_all_, "expanse_sim_release_all"))
      missing = "expanse_sim_release_all";
    else if (!h->resolve(&h->outstanding_host_, "expanse_sim_outstanding_host"))
      missing = "expanse_sim_outstanding_host";
    else if (!h->resolve(&h->async_faults_, "expanse_sim_async_faults"))
      missing = "expanse_sim_async_faults";
    if (missing != nullptr) {
      *error = path + " does not export " + missing;
      return nullptr;
    }
    return h;
  }
  ~DlopenHooks() override { dlclose(handle_); }
  DlopenHooks(const DlopenHooks&) = delete;
  DlopenHooks& operator=(const DlopenHooks&) = delete;

  std::string reset_uninitialized() override {
    if (configure_(kSimConf) != 0) {
      const char* e = last_error_();
      return std::string("expanse_sim_configure(\"") + kSimConf + "\") failed: " +
             (e != nullptr ? e : "?");
    }
    return "";
  }
  std::string reset_with(const std::string& extra) override {
    const std::string conf = std::string(kSimConf) + "," + extra;
    if (configure_(conf.c_str()) != 0) {
      const char* e = last_error_();
      return "expanse_sim_configure(\"" + conf + "\") failed: " + (e != nullptr ? e : "?");
    }
    return "";
  }
  unsigned long long call_count(const char* base_name) override { return call_count_(base_name); }
  void inject_failure(const char* base_name, unsigned long long nth, CUresult code) override {
    if (inject_(base_name, nth, static_cast<int>(code)) != 0) {
      const char* e = last_error_();
      throw std::runtime_error(std::string("expanse_sim_inject_failure(") + base_name +
                               ") failed: " + (e != nullptr ? e : "?"));
    }
  }
  void hold_stream(CUstream stream) override { hold_(stream); }
  void release_stream(CUstream stream) override { release_(stream); }
  void release_all() override { release_all_(); }
  SimOutstanding outstanding() override {
    SimOutstanding r;
    if (outstanding_(&r.reservations, &r.allocations, &r.mappings, &r.physical_bytes) != 0 ||
        outstanding_host_(&r.host_allocations, &r.host_bytes) != 0)
      throw std::runtime_error("expanse_sim_outstanding failed");
    return r;
  }
  unsigned long long async_faults() override { return async_faults_(); }

 private:
  explicit DlopenHooks(void* handle) : handle_(handle) {}
  template <class F>
  bool resolve(F* fn, const char* name) {
    void* sym = dlsym(handle_, name);
    if (sym == nullptr) return false;
    *fn = reinterpret_cast<F>(sym);
    return true;
  }

  void* handle_;
  int (*configure_)(const char*) = nullptr;
  const char* (*last_error_)() = nullptr;
  unsigned long long (*call_count_)(const char*) = nullptr;
  int (*inject_)(const char*, unsigned long long, int) = nullptr;
  void (*hold_)(void*) = nullptr;
  void (*release_)(void*) = nullptr;
  void (*release_all_)() = nullptr;
  int (*outstanding_)(unsigned long long*, unsigned long long*, unsigned long long*,
                      unsigned long long*) = nullptr;
  int (*outstanding_host_)(unsigned long long*, unsigned long long*) = nullptr;
  unsigned long long (*async_faults_)() = nullptr;
};

// ---- one loaded driver per variant, for the whole run -----------------------------------------

struct VariantState {
  std::unique_ptr<driver::LoadedDriver> driver;
  std::unique_ptr<SimHooks> hooks;
  std::string library_path;
  std::string error;  // why driver is null
  bool skip = false;  // null driver is a skip (no GPU), not a failure
};

VariantState load_variant(Variant v) {
  VariantState s;
  try {
    switch (v) {
      case Variant::sim_inprocess:
        s.driver = driver::load_sim(suite_sim_config(), "test");
        s.hooks = std::make_unique<InProcessHooks>();
        break;
      case Variant::sim_dlopen: {
        s.library_path = EXPANSE_BUILD_LIB_DIR "/libexpanse_simcuda.so";
        s.driver = driver::load_cuda(s.library_path);
        s.hooks = DlopenHooks::open(s.library_path, &s.error);
        if (!s.hooks) s.driver.reset();
        break;
      }
      case Variant::cuda: {
        s.library_path = "libcuda.so.1";
        s.skip = true;
        s.driver = driver::load_cuda(s.library_path);
        int count = 0;
        const CUresult r = s.driver->table().device_get_count(&count);
        if (r != CUDA_SUCCESS || count <= 0) {
          s.error = "libcuda.so.1 loaded, but cuDeviceGetCount gave " + result_name(r) +
                    " with count " + std::to_string(count);
          s.driver.reset();
        }
        break;
      }
    }
  } catch (const std::exception& e) {
    s.driver.reset();
    s.hooks.reset();
    s.error = e.what();
  }
  if (!s.driver && s.error.empty()) s.error = "no driver";
  return s;
}

VariantState& variant_state(Variant v) {
  static std::map<Variant, VariantState> states;
  auto it = states.find(v);
  if (it == states.end()) it = states.emplace(v, load_variant(v)).first;
  return it->second;
}

}  // namespace

// ---- fixture ----------------------------------------------------------------------------------

void Conformance::SetUp() {
  VariantState& s = variant_state(GetParam());
  if (!s.driver) {
    if (s.skip) GTEST_SKIP() << "no usable CUDA driver: " << s.error;
    FAIL() << variant_name(GetParam()) << " driver did not load: " << s.error;
  }
  hooks_ = s.hooks.get();
  library_path_ = s.library_path;
  if (hooks_ != nullptr) {
    const std::string err = hooks_->reset_uninitialized();
    ASSERT_TRUE(err.empty()) << err;
  }
  // In an isolated child every call is journaled before it is made (isolation.hpp).
  table_ = &journaled(s.driver->table());
  ASSERT_CU(CUDA_SUCCESS, t().init(0));
  ASSERT_CU(CUDA_SUCCESS, t().device_get_count(&device_count_));
  ASSERT_GT(device_count_, 0);
  const CUmemAllocationProp prop = device_prop(0);
  ASSERT_CU(CUDA_SUCCESS, t().mem_get_allocation_granularity(&gran_, &prop,
                                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_GT(gran_, 0u);
}

void Conformance::TearDown() {
  if (table_ == nullptr) return;
  // Undo what the test left, newest first, ignoring codes: the test has already been judged.
  for (auto it = mappings_.rbegin(); it != mappings_.rend(); ++it) t().mem_unmap(it->first, it->second);
  for (auto it = refs_.rbegin(); it != refs_.rend(); ++it) t().mem_release(*it);
  for (auto it = reservations_.rbegin(); it != reservations_.rend(); ++it)
    t().mem_address_free(it->first, it->second);
  for (CUevent e : events_) t().event_destroy(e);
  for (CUstream s : streams_) t().stream_destroy(s);
  if (!host_allocs_.empty()) {
    make_current();  // cuMemFreeHost needs a context
    for (void* p : host_allocs_) t().mem_free_host(p);
  }
  forget_all();
  t().ctx_set_current(nullptr);
  if (primary_ != nullptr) {
    t().device_primary_ctx_release(dev(0));
    primary_ = nullptr;
  }
  if (hooks_ != nullptr && !HasFatalFailure()) {
    // Every test undoes what it did, so a consistent sim holds nothing now.
    const SimOutstanding o = hooks_->outstanding();
    EXPECT_TRUE(o.empty()) << "after cleanup the sim still holds " << to_string(o);
  }
}

void Conformance::forget_all() {
  mappings_.clear();
  refs_.clear();
  reservations_.clear();
  events_.clear();
  streams_.clear();
  host_allocs_.clear();
}

void Conformance::reset_uninitialized() {
  ASSERT_NE(hooks_, nullptr);
  forget_all();
  primary_ = nullptr;
  const std::string err = hooks_->reset_uninitialized();
  ASSERT_TRUE(err.empty()) << err;
}

void Conformance::reconfigure(const std::string& extra) {
  ASSERT_NE(hooks_, nullptr);
  forget_all();
  primary_ = nullptr;
  const std::string err = hooks_->reset_with(extra);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_CU(CUDA_SUCCESS, t().init(0));
}

void* Conformance::library_symbol(const char* name) const {
  if (library_path_.empty()) return nullptr;
  void* handle = dlopen(library_path_.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* sym = dlsym(handle, name);
  dlclose(handle);  // the loader's own reference keeps the library loaded
  return sym;
}

void Conformance::must(CUresult r, const std::string& what) const {
  if (r != CUDA_SUCCESS) throw std::runtime_error(what + " returned " + result_name(r));
}

bool Conformance::ran_isolated() {
  if (hooks_ != nullptr || in_isolated_child()) return false;
  const std::string name = current_test_full_name();
  report_isolated(run_isolated(name), name);
  return true;
}

size_t Conformance::total_mem(int device) const {
  size_t bytes = 0;
  must(t().device_total_mem(&bytes, dev(device)), "cuDeviceTotalMem");
  return bytes;
}

CUdevice Conformance::dev(int ordinal) const {
  CUdevice d = 0;
  must(t().device_get(&d, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  return d;
}

CUmemAllocationProp Conformance::device_prop(int device) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUmemAccessDesc Conformance::access_desc(int device, CUmemAccess_flags f) {
  CUmemAccessDesc d;
  std::memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = f;
  return d;
}

CUcontext Conformance::make_current() {
  if (primary_ == nullptr)
    must(t().device_primary_ctx_retain(&primary_, dev(0)), "cuDevicePrimaryCtxRetain");
  must(t().ctx_set_current(primary_), "cuCtxSetCurrent");
  return primary_;
}

size_t Conformance::mem_free() {
  make_current();
  size_t free_bytes = 0;
  size_t total = 0;
  must(t().mem_get_info(&free_bytes, &total), "cuMemGetInfo");
  return free_bytes;
}

CUresult Conformance::try_reserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                  CUdeviceptr addr, unsigned long long flags) {
  const CUresult r = t().mem_address_reserve(ptr, size, alignment, addr, flags);
  if (r == CUDA_SUCCESS && ptr != nullptr) reservations_.emplace_back(*ptr, size);
  return r;
}

CUdeviceptr Conformance::reserve(size_t size, size_t alignment, CUdeviceptr addr) {
  CUdeviceptr p = 0;
  must(try_reserve(&p, size, alignment, addr), "cuMemAddressReserve(size " + std::to_string(size) + ")");
  return p;
}

CUresult Conformance::address_free(CUdeviceptr ptr, size_t size) {
  const CUresult r = t().mem_address_free(ptr, size);
  if (r == CUDA_SUCCESS) {
    auto it = std::find(reservations_.begin(), reservations_.end(), std::make_pair(ptr, size));
    if (it != reservations_.end()) reservations_.erase(it);
  }
  return r;
}

CUresult Conformance::try_create(CUmemGenericAllocationHandle* handle, size_t size,
                                 const CUmemAllocationProp& prop, unsigned long long flags) {
  const CUresult r = t().mem_create(handle, size, &prop, flags);
  if (r == CUDA_SUCCESS && handle != nullptr) refs_.push_back(*handle);
  return r;
}

CUmemGenericAllocationHandle Conformance::create(size_t size, int device) {
  CUmemGenericAllocationHandle h = 0;
  must(try_create(&h, size, device_prop(device)),
       "cuMemCreate(size " + std::to_string(size) + ", device " + std::to_string(device) + ")");
  return h;
}

CUresult Conformance::release(CUmemGenericAllocationHandle handle) {
  const CUresult r = t().mem_release(handle);
  if (r == CUDA_SUCCESS) {
    auto it = std::find(refs_.begin(), refs_.end(), handle);
    if (it != refs_.end()) refs_.erase(it);
  }
  return r;
}

CUresult Conformance::retain(CUmemGenericAllocationHandle* handle, CUdeviceptr addr) {
  const CUresult r =
      t().mem_retain_allocation_handle(handle, reinterpret_cast<void*>(static_cast<uintptr_t>(addr)));
  if (r == CUDA_SUCCESS && handle != nullptr) refs_.push_back(*handle);
  return r;
}

CUresult Conformance::try_map(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle h, unsigned long long flags) {
  const CUresult r = t().mem_map(ptr, size, offset, h, flags);
  if (r == CUDA_SUCCESS) mappings_.emplace_back(ptr, size);
  return r;
}

void Conformance::map(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle h) {
  must(try_map(ptr, size, 0, h), "cuMemMap(size " + std::to_string(size) + ")");
}

CUresult Conformance::unmap(CUdeviceptr ptr, size_t size) {
  const CUresult r = t().mem_unmap(ptr, size);
  if (r == CUDA_SUCCESS) {
    mappings_.erase(std::remove_if(mappings_.begin(), mappings_.end(),
                                   [&](const std::pair<CUdeviceptr, size_t>& m) {
                                     return m.first >= ptr && m.first + m.second <= ptr + size;
                                   }),
                    mappings_.end());
  }
  return r;
}

CUresult Conformance::set_access(CUdeviceptr ptr, size_t size, int device, CUmemAccess_flags f) {
  const CUmemAccessDesc d = access_desc(device, f);
  return t().mem_set_access(ptr, size, &d, 1);
}

unsigned long long Conformance::get_access(CUdeviceptr ptr, int device) {
  CUmemLocation loc;
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = device;
  unsigned long long flags = 0xdead;
  must(t().mem_get_access(&flags, &loc, ptr), "cuMemGetAccess");
  return flags;
}

CUresult Conformance::try_host_alloc(void** p, size_t bytes, unsigned flags) {
  const CUresult r = t().mem_host_alloc(p, bytes, flags);
  if (r == CUDA_SUCCESS && p != nullptr) host_allocs_.push_back(*p);
  return r;
}

void* Conformance::host_alloc(size_t bytes, unsigned flags) {
  void* p = nullptr;
  must(try_host_alloc(&p, bytes, flags), "cuMemHostAlloc(" + std::to_string(bytes) + ")");
  return p;
}

CUresult Conformance::free_host(void* p) {
  const CUresult r = t().mem_free_host(p);
  if (r == CUDA_SUCCESS) {
    auto it = std::find(host_allocs_.begin(), host_allocs_.end(), p);
    if (it != host_allocs_.end()) host_allocs_.erase(it);
  }
  return r;
}

CUstream Conformance::make_stream(unsigned flags) {
  make_current();
  CUstream s = nullptr;
  must(t().stream_create(&s, flags), "cuStreamCreate");
  streams_.push_back(s);
  return s;
}

CUevent Conformance::make_event(unsigned flags) {
  make_current();
  CUevent e = nullptr;
  must(t().event_create(&e, flags), "cuEventCreate");
  events_.push_back(e);
  return e;
}

CUresult Conformance::destroy_stream(CUstream s) {
  const CUresult r = t().stream_destroy(s);
  if (r == CUDA_SUCCESS) streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
  return r;
}

CUresult Conformance::destroy_event(CUevent e) {
  const CUresult r = t().event_destroy(e);
  if (r == CUDA_SUCCESS) events_.erase(std::remove(events_.begin(), events_.end(), e), events_.end());
  return r;
}

bool Conformance::reserve_adjacent(size_t size, CUdeviceptr* a, CUdeviceptr* b) {
  const CUdeviceptr base = reserve(2 * size);
  must(address_free(base, 2 * size), "cuMemAddressFree");
  *a = reserve(size, 0, base);
  *b = reserve(size, 0, base + size);
  return *a == base && *b == base + size;
}

Block Conformance::make_block(size_t pages) {
  Block b;
  b.size = pages * gran_;
  b.ptr = reserve(b.size);
  b.handle = create(b.size);
  map(b.ptr, b.size, b.handle);
  must(set_access(b.ptr, b.size), "cuMemSetAccess");
  return b;
}

INSTANTIATE_TEST_SUITE_P(Drivers, Conformance,
                         ::testing::Values(Variant::sim_inprocess, Variant::sim_dlopen,
                                           Variant::cuda),
                         [](const ::testing::TestParamInfo<Variant>& param_info) {
                           return std::string(variant_name(param_info.param));
                         });

}  // namespace expanse::conformance
