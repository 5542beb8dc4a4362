// A neighbour on the same device (sim.hpp): memory another process holds, taken and given back
// by a test's hook between this process's calls.
#include "sim/sim_call.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace expanse::sim {

struct NeighbourAccess {
  static Neighbour make(State& s) { return Neighbour(&s); }
  static State& state(const Neighbour& n) { return *static_cast<State*>(n.state_); }
};

namespace {

Device& checked_device(State& s, int d) {
  if (!valid_device(s, d)) {
    throw std::invalid_argument("sim neighbour: no device " + std::to_string(d) + " (the sim has " +
                                std::to_string(s.devices.size()) + ")");
  }
  return device(s, d);
}

}  // namespace

size_t Neighbour::take(int d, size_t bytes) {
  State& s = NeighbourAccess::state(*this);
  Device& dev = checked_device(s, d);
  const size_t n = std::min(bytes, s.cfg.capacity - dev.physical_used);
  dev.physical_used += n;
  dev.neighbour += n;
  return n;
}

size_t Neighbour::give(int d, size_t bytes) {
  State& s = NeighbourAccess::state(*this);
  Device& dev = checked_device(s, d);
  const size_t n = std::min(bytes, dev.neighbour);
  dev.physical_used -= n;
  dev.neighbour -= n;
  return n;
}

size_t Neighbour::holds(int d) const {
  State& s = NeighbourAccess::state(*this);
  return checked_device(s, d).neighbour;
}

size_t Neighbour::free_bytes(int d) const {
  State& s = NeighbourAccess::state(*this);
  return s.cfg.capacity - checked_device(s, d).physical_used;
}

void detail::run_neighbour(State& s, EntryPoint e, CUresult r) {
  Neighbour n = NeighbourAccess::make(s);
  s.neighbour_hook(e, r, n);
}

void set_neighbour(NeighbourHook hook) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  detail::state_locked().neighbour_hook = std::move(hook);
}

size_t neighbour_take(int d, size_t bytes) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  return NeighbourAccess::make(detail::state_locked()).take(d, bytes);
}

size_t neighbour_give(int d, size_t bytes) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  return NeighbourAccess::make(detail::state_locked()).give(d, bytes);
}

size_t neighbour_holds(int d) {
  std::lock_guard<std::mutex> lock(detail::state_mutex());
  return NeighbourAccess::make(detail::state_locked()).holds(d);
}

}  // namespace expanse::sim
