#include "api/fork_guard.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace expanse::api {
namespace {

std::atomic<long> g_driver_pid{0};  // the process that initialised the driver

void mark_child() noexcept { detail::forked_child.store(true, std::memory_order_relaxed); }

}  // namespace

void note_driver_initialised() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    g_driver_pid.store(static_cast<long>(getpid()), std::memory_order_relaxed);
    pthread_atfork(nullptr, nullptr, mark_child);
  });
}

std::string forked_child_message(const char* what) {
  std::string m = "expanse";
  if (what != nullptr && *what != '\0') m += std::string(": ") + what;
  m += ": this process (pid " + std::to_string(getpid()) + ") was forked after pid " +
       std::to_string(g_driver_pid.load(std::memory_order_relaxed)) +
       " initialised the CUDA driver, which a forked child can never use; nothing was done. "
       "Start workers with spawn (Python: multiprocessing.set_start_method(\"spawn\")), or fork "
       "before the first expanse or CUDA call";
  return m;
}

}  // namespace expanse::api
