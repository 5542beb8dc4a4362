// The C control functions of libexpanse_simcuda.so (expanse_sim_control.h), and the library's
// configuration: from EXPANSE_CONF at first use, or expanse_sim_configure().
#pragma GCC visibility push(default)
#include "sim/export/expanse_sim_control.h"
#pragma GCC visibility pop

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "conf/env_config.hpp"
#include "sim/export/simcuda_internal.hpp"
#include "sim/sim.hpp"

#define EXPANSE_EXPORT extern "C" __attribute__((visibility("default")))

namespace expanse::sim::exported {
namespace {

std::atomic<bool> g_configured{false};
std::mutex g_configure_mutex;
thread_local std::string t_last_error;
thread_local std::string t_description;

// The entry point a control function names by base or exported name; false (with the reason in
// expanse_sim_last_error) for any other name.
bool entry_point_by_name(const char* name, driver::EntryPoint* out) {
  if (name != nullptr) {
    for (int i = 0; i < driver::kEntryPointCount; ++i) {
      const auto e = static_cast<driver::EntryPoint>(i);
      if (std::strcmp(driver::entry_point_name(e), name) == 0 ||
          std::strcmp(driver::entry_point_symbol(e), name) == 0) {
        *out = e;
        return true;
      }
    }
  }
  t_last_error = std::string("not a driver entry point: ") + (name != nullptr ? name : "(null)");
  return false;
}

// Runs f; an exception it throws becomes expanse_sim_last_error's message (false).
template <class F>
bool reporting_failure(F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return false;
  }
}

}  // namespace

void ensure_configured() noexcept {
  if (g_configured.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  if (g_configured.load(std::memory_order_relaxed)) return;
  try {
    reset(sim_config_from_string(conf::from_environment()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libexpanse_simcuda: %s; the sim has no devices\n", e.what());
    try {
      SimConfig none;
      none.devices = 0;
      reset(none);
    } catch (...) {
    }
  }
  g_configured.store(true, std::memory_order_release);
}

}  // namespace expanse::sim::exported

using expanse::sim::exported::ensure_configured;
using expanse::sim::exported::entry_point_by_name;
using expanse::sim::exported::reporting_failure;
namespace sim = expanse::sim;

EXPANSE_EXPORT int expanse_sim_configure(const char* conf) {
  using namespace expanse::sim::exported;
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  const std::string text = conf != nullptr ? conf : "";
  if (!reporting_failure([&] { sim::reset(sim::sim_config_from_string(text)); })) return 1;
  g_configured.store(true, std::memory_order_release);
  t_last_error.clear();
  return 0;
}

EXPANSE_EXPORT const char* expanse_sim_last_error(void) {
  return expanse::sim::exported::t_last_error.c_str();
}

EXPANSE_EXPORT unsigned long long expanse_sim_call_count(const char* base_name) {
  ensure_configured();
  expanse::driver::EntryPoint e{};
  if (!entry_point_by_name(base_name, &e)) return 0;
  return sim::call_count(e);
}

EXPANSE_EXPORT unsigned long long expanse_sim_total_calls(void) {
  ensure_configured();
  return sim::total_calls();
}

EXPANSE_EXPORT void expanse_sim_reset_counts(void) {
  ensure_configured();
  sim::reset_counts();
}

EXPANSE_EXPORT int expanse_sim_inject_failure(const char* base_name, unsigned long long nth,
                                              int code) {
  ensure_configured();
  expanse::driver::EntryPoint e{};
  if (!entry_point_by_name(base_name, &e)) return 1;
  const bool injected =
      reporting_failure([&] { sim::inject_failure(e, nth, static_cast<CUresult>(code)); });
  return injected ? 0 : 1;
}

EXPANSE_EXPORT void expanse_sim_clear_injections(void) {
  ensure_configured();
  sim::clear_injections();
}

EXPANSE_EXPORT double expanse_sim_modeled_seconds(void) {
  ensure_configured();
  return sim::modeled_seconds();
}

EXPANSE_EXPORT void expanse_sim_hold_stream(void* stream) {
  ensure_configured();
  reporting_failure([&] { sim::hold_stream(static_cast<CUstream>(stream)); });
}

EXPANSE_EXPORT void expanse_sim_release_stream(void* stream) {
  ensure_configured();
  reporting_failure([&] { sim::release_stream(static_cast<CUstream>(stream)); });
}

EXPANSE_EXPORT void expanse_sim_release_all(void) {
  ensure_configured();
  sim::release_all();
}

EXPANSE_EXPORT unsigned long long expanse_sim_dead_handle_uses(void) {
  ensure_configured();
  return sim::dead_handle_uses();
}

EXPANSE_EXPORT unsigned long long expanse_sim_pending_events(void) {
  ensure_configured();
  return sim::pending_events();
}

EXPANSE_EXPORT int expanse_sim_outstanding(unsigned long long* reservations,
                                           unsigned long long* allocations,
                                           unsigned long long* mappings,
                                           unsigned long long* physical_bytes) {
  ensure_configured();
  const sim::Outstanding o = sim::outstanding();
  if (reservations != nullptr) *reservations = o.reservations;
  if (allocations != nullptr) *allocations = o.allocations;
  if (mappings != nullptr) *mappings = o.mappings;
  if (physical_bytes != nullptr) *physical_bytes = o.physical_bytes;
  return 0;
}

EXPANSE_EXPORT int expanse_sim_outstanding_host(unsigned long long* allocations,
                                                unsigned long long* bytes) {
  ensure_configured();
  const sim::Outstanding o = sim::outstanding();
  if (allocations != nullptr) *allocations = o.host_allocations;
  if (bytes != nullptr) *bytes = o.host_bytes;
  return 0;
}

EXPANSE_EXPORT unsigned long long expanse_sim_async_faults(void) {
  ensure_configured();
  return sim::async_faults();
}

EXPANSE_EXPORT const char* expanse_sim_describe_outstanding(void) {
  ensure_configured();
  expanse::sim::exported::t_description = sim::describe_outstanding();
  return expanse::sim::exported::t_description.c_str();
}
