// How every sim entry point runs (the lock, call counting, injected failures, the cuInit check,
// modeled cost), and the small helpers the entry-point files share. Internal to sim/.
#pragma once

#include "sim/sim_internal.hpp"

#include <cstdint>
#include <map>
#include <vector>

namespace expanse::sim::detail {

using driver::EntryPoint;

// What one call covered, for the cost model: bytes over `mappings` handles, `times` over (one
// per access descriptor of cuMemSetAccess).
struct CallSize {
  size_t bytes = 0;
  size_t mappings = 1;
  double times = 1;
};

// This process's id, kept by a fork handler (no system call per entry point).
pid_t this_process() noexcept;

// Whether s was initialized by cuInit in this process. A child forked after cuInit inherits the
// State but not the device: the real driver answers CUDA_ERROR_NOT_INITIALIZED to every call
// there, cuInit included (triton-lang/triton PR #10443: "a process that was fork()ed after its
// parent already initialized CUDA gets CUDA_ERROR_NOT_INITIALIZED (rc=3) from cuInit", and
// cuDeviceGetCount the same; tensorflow issue #57877: "Failed setting context:
// CUDA_ERROR_NOT_INITIALIZED" in a multiprocessing fork child; NVIDIA: no CUDA use in a forked
// child before exec). Only a fresh process (exec, posix_spawn) may use the driver again.
inline bool initialized_here(const State& s) noexcept {
  return s.initialized && s.init_pid == this_process();
}

// The neighbour's hook after a call (sim_neighbour.cpp).
void run_neighbour(State& s, EntryPoint e, CUresult r);

template <class Body>
CUresult run(EntryPoint e, bool needs_init, Body&& body) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  State& s = detail::state_locked();
  const auto i = static_cast<size_t>(e);
  detail::call_counters()[i].fetch_add(1);
  // Calls answered without the lock count too (only while nothing is injected for e).
  const uint64_t n = ++s.calls_seen[i] + detail::fast_calls(e);
  auto& inj = s.injections[i];
  if (!inj.empty()) {
    auto it = inj.find(n);
    if (it != inj.end()) {
      const CUresult code = it->second;
      inj.erase(inj.begin(), std::next(it));
      if (inj.empty()) detail::set_injection_armed(e, false);
      return code;
    }
  }
  if (needs_init && !initialized_here(s)) return CUDA_ERROR_NOT_INITIALIZED;
  CallSize size;
  // Names the call for capture invalidation records (invalidate()).
  struct CallScope {
    const char* old;
    explicit CallScope(EntryPoint e) : old(detail::current_call()) {
      detail::current_call() = driver::entry_point_name(e);
    }
    ~CallScope() { detail::current_call() = old; }
  } scope(e);
  const CUresult r = body(s, size);
  if (r == CUDA_SUCCESS) s.modeled_ns += s.costs.cost_ns(e, size.bytes, size.mappings) * size.times;
  if (s.neighbour_hook) detail::run_neighbour(s, e, r);
  return r;
}

inline bool valid_device(const State& s, int d) noexcept {
  return d >= 0 && d < static_cast<int>(s.devices.size());
}

inline Device& device(State& s, int d) { return *s.devices[static_cast<size_t>(d)]; }

inline bool vmm_context_ok(State& s) {
  return !s.policy.require_context_for_vmm || detail::current_device(s) >= 0;
}

inline bool aligned(uint64_t v, uint64_t a) noexcept { return v % a == 0; }


// Shared between the entry-point files (sim_streams.cpp defines it).
void reset_device_context(State& s, int d);

}  // namespace expanse::sim::detail

// The names every entry-point file uses, without the detail:: prefix.
namespace expanse::sim {
using detail::AccessBits;
using detail::Allocation;
using detail::Capture;
using detail::CallSize;
using detail::Context;
using detail::Device;
using detail::Event;
using detail::Mapping;
using detail::State;
using detail::Stream;
using detail::aligned;
using detail::device;

using detail::run;
using detail::valid_device;
using detail::vmm_context_ok;
using driver::EntryPoint;
}  // namespace expanse::sim
