#include "api/runtime.hpp"

#include "api/fork_guard.hpp"
#include "api/history.hpp"

#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

namespace expanse::api {
namespace {

// The runtime is never destroyed at exit: the CUDA driver (and the in-process sim) may already be
// gone then. expanse_shutdown() destroys it explicitly.
std::mutex g_mu;
std::atomic<Runtime*> g_runtime{nullptr};
// After a failed expanse_init the runtime stays unconfigured — it does not silently fall back to
// EXPANSE_CONF — and every call reports that failure until init succeeds or shutdown is called.
std::string g_init_failure;
int g_init_failure_code = 0;  // 0: usage_error, else the CUresult of a driver_failure

}  // namespace

Runtime::Runtime(const std::string& conf) : config_(conf::parse_config(conf)) {
  try {
    driver_ = driver::select_driver(conf, /*allow_sim_fallback=*/false);
  } catch (const driver::driver_error& e) {
    throw driver_failure(std::string("expanse: ") + e.what() +
                             " (set EXPANSE_CONF=driver:sim to use the software driver)",
                         static_cast<int>(e.code()));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  note_driver_initialised();  // a child forked from here on is told it cannot use expanse
  int n = 0;
  driver_->check(driver_->table().device_get_count(&n), driver::EntryPoint::device_get_count);
  slots_ = std::vector<std::atomic<core::DeviceAllocator*>>(static_cast<size_t>(n));
  for (auto& s : slots_) s.store(nullptr);
  owned_.resize(static_cast<size_t>(n));
  routes_ = std::make_unique<PoolRoutes>(*driver_);
  host_ = std::make_unique<HostPools>(*this, config_.host_limit);
}

Runtime::~Runtime() {
  // The allocators' sleep staging lives in the host pools: given back, and the pools unset,
  // before they go; their pages and events live in the allocators' primary contexts.
  for (auto& a : owned_) {
    if (a) {
      a->release_host_backup();
      a->set_host_staging(nullptr);
    }
  }
  host_.reset();
  routes_.reset();  // ends the capture announcements its routes made
  owned_.clear();  // allocators give everything back before the driver goes
}

Runtime& Runtime::get() {
  // The C++ facade's way in too: a forked child is told, whatever it calls.
  if (in_forked_child()) throw driver_failure(forked_child_message(nullptr), 0);
  Runtime* r = g_runtime.load(std::memory_order_acquire);
  if (r != nullptr) return *r;
  std::lock_guard<std::mutex> lock(g_mu);
  r = g_runtime.load(std::memory_order_relaxed);
  if (r == nullptr && !g_init_failure.empty()) {
    const std::string m = "expanse: not configured: expanse_init failed (" + g_init_failure +
                          "); call expanse_init again, or expanse_shutdown to use EXPANSE_CONF";
    if (g_init_failure_code != 0) throw driver_failure(m, g_init_failure_code);
    throw usage_error(m);
  }
  if (r == nullptr) {
    r = new Runtime(conf::from_environment());
    g_runtime.store(r, std::memory_order_release);
  }
  return *r;
}

bool Runtime::any_live() const {
  for (const auto& a : owned_) {
    if (a && a->stats().live_blocks != 0) return true;
  }
  return host_ != nullptr && host_->any_live();
}

void Runtime::init(const std::string& conf) {
  if (in_forked_child()) throw driver_failure(forked_child_message("init"), 0);
  std::lock_guard<std::mutex> lock(g_mu);
  Runtime* old = g_runtime.load(std::memory_order_relaxed);
  if (old != nullptr && old->any_live()) {
    throw usage_error("expanse_init: blocks are still live; free them before reconfiguring");
  }
  conf::Config checked = conf::parse_config(conf);  // fail on a bad string before tearing anything down
  (void)checked;
  g_runtime.store(nullptr, std::memory_order_release);
  delete old;
  try {
    g_runtime.store(new Runtime(conf), std::memory_order_release);
    g_init_failure.clear();
  } catch (const driver_failure& e) {
    g_init_failure = e.what();
    g_init_failure_code = e.cu_result();
    throw;
  } catch (const std::exception& e) {
    g_init_failure = e.what();
    g_init_failure_code = 0;
    throw;
  }
}

void Runtime::shutdown() {
  if (in_forked_child()) throw driver_failure(forked_child_message("shutdown"), 0);
  std::lock_guard<std::mutex> lock(g_mu);
  g_init_failure.clear();
  Runtime* old = g_runtime.load(std::memory_order_relaxed);
  if (old == nullptr) return;
  if (old->any_live()) {
    throw usage_error("expanse_shutdown: blocks are still live; free them first");
  }
  g_runtime.store(nullptr, std::memory_order_release);
  delete old;
}

Runtime* Runtime::current() noexcept { return g_runtime.load(std::memory_order_acquire); }

core::DeviceAllocator* Runtime::existing(int device) const {
  if (device < 0 || device >= device_count()) return nullptr;
  return slots_[static_cast<size_t>(device)].load(std::memory_order_seq_cst);  // see device()
}

void Runtime::check_exists(int device) const {
  if (device < 0 || device >= device_count()) {
    throw usage_error("expanse: device " + std::to_string(device) + " does not exist (" +
                      std::to_string(device_count()) + " device" +
                      (device_count() == 1 ? "" : "s") + ", driver " + driver_->description() +
                      ")");
  }
}

size_t Runtime::capacity_of(int device) const {
  try {
    size_t capacity = 0;
    CUdevice dev = 0;
    driver_->check(driver_->table().device_get(&dev, device), driver::EntryPoint::device_get);
    driver_->check(driver_->table().device_total_mem(&capacity, dev),
                   driver::EntryPoint::device_total_mem);
    return capacity;
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: setting up device " + std::to_string(device) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

Runtime::Unset Runtime::before_setup(int device) const {
  check_exists(device);
  Unset u;
  u.capacity = capacity_of(device);
  u.limit = conf::options_for_device(config_, u.capacity).limit;
  return u;
}

core::DeviceAllocator& Runtime::device(int device) {
  if (core::DeviceAllocator* a = existing(device)) return *a;
  check_exists(device);
  std::lock_guard<std::mutex> lock(create_mu_);
  auto& slot = slots_[static_cast<size_t>(device)];
  if (core::DeviceAllocator* a = slot.load(std::memory_order_acquire)) return *a;
  const size_t capacity = capacity_of(device);
  try {
    owned_[static_cast<size_t>(device)] = std::make_unique<core::DeviceAllocator>(
        *driver_, device, conf::options_for_device(config_, capacity));
    owned_[static_cast<size_t>(device)]->set_host_staging(host_.get());  // sleeps stage there
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: setting up device " + std::to_string(device) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
  // seq_cst store, then seq_cst load of the flag (History::record does the mirror image): either
  // it sees this slot or this sees its flag. (Not fences: TSan does not model them.)
  slot.store(owned_[static_cast<size_t>(device)].get(), std::memory_order_seq_cst);
  History::get().attach_if_recording(*owned_[static_cast<size_t>(device)]);
  return *owned_[static_cast<size_t>(device)];
}

void Runtime::capture_ended(CUstream s) {
  for (int d = 0; d < device_count(); ++d) {
    if (core::DeviceAllocator* a = existing(d)) a->capture_ended(s);
  }
}

}  // namespace expanse::api
