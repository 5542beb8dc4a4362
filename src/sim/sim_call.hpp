// How every sim entry point runs (the lock, call counting, injected failures, the cuInit check,
// modeled cost), and the small helpers the entry-point files share. Internal to sim/.
#pragma once

#include "sim/sim_internal.hpp"

#include <cstdint>
#include <map>
#include <vector>

namespace expanse::sim::detail {

using driver::EntryPoint;

template <class Body>
CUresult run(EntryPoint e, bool needs_init, Body&& body) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  State& s = detail::state_locked();
  const auto i = static_cast<size_t>(e);
  detail::call_counters()[i].fetch_add(1);
  const uint64_t n = ++s.calls_seen[i];
  auto& inj = s.injections[i];
  if (!inj.empty()) {
    auto it = inj.find(n);
    if (it != inj.end()) {
      const CUresult code = it->second;
      inj.erase(inj.begin(), std::next(it));
      return code;
    }
  }
  if (needs_init && !s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  double units = 1;
  const CUresult r = body(s, units);
  if (r == CUDA_SUCCESS) {
    const double c = s.costs.per_call_ns[i];
    s.modeled_ns += s.costs.per_page[i] ? c * units : c;
  }
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

inline double pages(const State& s, size_t bytes) noexcept {
  return static_cast<double>(bytes / s.cfg.granularity);
}

// Shared between the entry-point files (sim_streams.cpp defines it).
void reset_device_context(State& s, int d);

}  // namespace expanse::sim::detail

// The names every entry-point file uses, without the detail:: prefix.
namespace expanse::sim {
using detail::AccessBits;
using detail::Allocation;
using detail::Context;
using detail::Device;
using detail::Event;
using detail::Mapping;
using detail::State;
using detail::Stream;
using detail::aligned;
using detail::device;
using detail::pages;
using detail::run;
using detail::valid_device;
using detail::vmm_context_ok;
using driver::EntryPoint;
}  // namespace expanse::sim
