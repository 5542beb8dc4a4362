// Sleep and wake of a pool through the C ABI and the C++ API (core/sleep_wake.cpp does the work):
// the checks only the API can make (the stream's device, captures routed into the pool) and the
// wake hook.
#include "api/pool_registry.hpp"
#include "api/runtime.hpp"
#include "expanse/errors.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

namespace expanse::api {
namespace {

std::mutex g_hook_mu;
void (*g_hook)(uint64_t, void*) = nullptr;
void* g_hook_ctx = nullptr;

}  // namespace

bool pool_sleep(core::PoolId id, int mode, CUstream stream) {
  const char* what = "expanse_pool_sleep";
  using Mode = core::DeviceAllocator::SleepMode;
  Mode m = Mode::offload;
  if (mode == EXPANSE_SLEEP_OFFLOAD) {
    m = Mode::offload;
  } else if (mode == EXPANSE_SLEEP_DISCARD) {
    m = Mode::discard;
  } else if (mode == (EXPANSE_SLEEP_DISCARD | EXPANSE_SLEEP_ZERO_ON_WAKE)) {
    m = Mode::discard_zeroed;
  } else {
    throw usage_error(std::string(what) + ": pool " + std::to_string(id) + ": mode " +
                      std::to_string(mode) +
                      " is none of EXPANSE_SLEEP_OFFLOAD (1), EXPANSE_SLEEP_DISCARD (2) and "
                      "EXPANSE_SLEEP_DISCARD | EXPANSE_SLEEP_ZERO_ON_WAKE (6); nothing was "
                      "changed");
  }
  Runtime& rt = Runtime::get();
  int device = 0;
  core::DeviceAllocator& a = live_pool(rt, id, what, &device);
  check_stream_device(rt, id, device, stream, what);
  if (rt.routes().captures_into(id) != 0) return false;  // its graph is being recorded
  return a.sleep_pool(id, m);
}

void pool_wake(core::PoolId id, CUstream stream) {
  const char* what = "expanse_pool_wake";
  Runtime& rt = Runtime::get();
  // A released pool may be woken too (its live blocks stay valid): no use-count check here.
  const int device = rt.pools().device_of(id, what);
  core::DeviceAllocator& a = rt.device(device);
  check_stream_device(rt, id, device, stream, what);
  // Done when it returns: work on `stream` after this call sees the content.
  a.wake_pool(id);
  void (*hook)(uint64_t, void*) = nullptr;
  void* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    hook = g_hook;
    ctx = g_hook_ctx;
  }
  if (hook != nullptr) hook(id, ctx);
}

bool pool_is_asleep(core::PoolId id) {
  Runtime& rt = Runtime::get();
  const int device = rt.pools().device_of(id, "expanse_pool_is_asleep");
  core::DeviceAllocator& a = rt.device(device);
  return a.has_pool(id) && a.pool_is_asleep(id);
}

size_t release_host_backup(int device) {
  Runtime& rt = Runtime::get();
  if (device < 0 || device >= rt.device_count()) {
    throw usage_error("expanse_release_host_backup: device " + std::to_string(device) +
                      " does not exist (" + std::to_string(rt.device_count()) + " devices)");
  }
  core::DeviceAllocator* a = rt.existing(device);
  return a == nullptr ? 0 : a->release_host_backup();
}

void set_wake_hook(void (*hook)(uint64_t id, void* ctx), void* ctx) {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  g_hook = hook;
  g_hook_ctx = ctx;
}

}  // namespace expanse::api
