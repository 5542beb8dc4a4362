// The sim's state (internal to sim/). One State object holds everything; reset() replaces it.
// Every access happens with state_mutex() held.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sim/host_backing.hpp"
#include "sim/sim.hpp"

namespace expanse::sim::detail {

constexpr int kMaxDevices = 64;

// The value of an enum-typed argument as the caller passed it. A C caller may pass any int, which
// C++ may not even load as the enum (UBSan: "not a valid value for type"), so read its bits.
template <class E>
int bits(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(int), "enum with int representation");
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
constexpr int kEntryCount = driver::kEntryPointCount;

// Access granted to each device: one bit per device ordinal.
struct AccessBits {
  uint64_t read = 0;
  uint64_t write = 0;
  bool operator==(const AccessBits& o) const noexcept { return read == o.read && write == o.write; }
  bool operator!=(const AccessBits& o) const noexcept { return !(*this == o); }
  // CU_MEM_ACCESS_FLAGS_PROT_* of device d.
  int flags_of(int d) const noexcept {
    const uint64_t bit = uint64_t{1} << d;
    if ((write & bit) != 0) return 3;
    if ((read & bit) != 0) return 1;
    return 0;
  }
  void set(int d, int flags) noexcept {
    const uint64_t bit = uint64_t{1} << d;
    read &= ~bit;
    write &= ~bit;
    if (flags == 1 || flags == 3) read |= bit;
    if (flags == 3) write |= bit;
  }
  // What the host (standing in for every device) may do: the union over devices.
  int host_flags() const noexcept { return write != 0 ? 3 : (read != 0 ? 1 : 0); }
};

struct Allocation {
  CUmemGenericAllocationHandle handle = 0;
  int device = 0;
  size_t size = 0;
  CUmemAllocationProp prop{};
  uint64_t user_refs = 0;  // cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease
  uint64_t map_refs = 0;   // live mappings
  uint64_t offset = 0;     // extent in the device's memfd (backing only)
};

struct Mapping {
  size_t size = 0;
  Allocation* alloc = nullptr;
  // Access runs: offset within the mapping -> access from there to the next key (or the end).
  std::map<size_t, AccessBits> access;
};

struct Reservation {
  size_t size = 0;
};

struct Context {
  int device = 0;
};

// A stream is an ordered list of work items (seq 1, 2, ...). An item completes when every item
// before it on its stream has completed, its stream is not held, and its dependencies (items on
// other streams) have completed. Synchronizing forces completion regardless of holds.
struct Stream : std::enable_shared_from_this<Stream> {
  struct Dep {
    std::shared_ptr<Stream> stream;
    uint64_t seq = 0;
  };
  struct Item {
    uint64_t seq = 0;
    std::vector<Dep> deps;
  };
  int device = 0;
  unsigned flags = 0;
  bool is_default = false;  // the legacy NULL stream of its device
  bool held = false;
  bool destroyed = false;
  uint64_t next_seq = 1;
  uint64_t done_seq = 0;
  std::deque<Item> pending;
  uint64_t last_seq() const noexcept { return next_seq - 1; }
};

struct Event {
  int device = 0;
  unsigned flags = 0;
  std::shared_ptr<Stream> stream;  // where it was last recorded; null: never recorded
  uint64_t seq = 0;
  bool complete() const noexcept { return !stream || stream->done_seq >= seq; }
};

struct Device {
  int ordinal = 0;
  Context ctx;
  int primary_refs = 0;
  size_t physical_used = 0;
  std::shared_ptr<Stream> default_stream;
  PhysicalStore store;
};

struct State {
  explicit State(const SimConfig& c);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  SimConfig cfg;
  Policy policy;
  CostTable costs;
  bool initialized = false;
  uint64_t generation = 0;  // identifies this State to thread-local context stacks

  std::vector<std::unique_ptr<Device>> devices;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::unordered_map<CUmemGenericAllocationHandle, std::unique_ptr<Allocation>> allocations;
  size_t mapped_bytes = 0;

  std::unordered_map<const Stream*, std::shared_ptr<Stream>> streams;  // live created streams
  std::unordered_map<const Stream*, std::shared_ptr<Stream>> busy;  // any stream with pending work
  std::unordered_map<const Event*, std::unique_ptr<Event>> events;

  std::array<std::map<uint64_t, CUresult>, kEntryCount> injections;  // call number -> code
  std::array<uint64_t, kEntryCount> calls_seen{};  // monotonic, not cleared by reset_counts
  double modeled_ns = 0;
};

// The global lock and the current state (created on first use with the default config).
std::mutex& state_mutex() noexcept;
State& state_locked();
// Call counters, readable without the lock.
std::atomic<uint64_t>* call_counters() noexcept;

// The calling thread's context stack (emptied when the state it belonged to was replaced).
std::vector<Context*>& context_stack(State& s);
// Resolves a context handle against the live state; nullptr if it is not one of ours.
Context* find_context(State& s, CUcontext ctx) noexcept;
// The device of the calling thread's current context, or -1 if there is none (or it was released).
int current_device(State& s) noexcept;

// Streams/events bookkeeping used by both the entry points and the control API.
// Resolves a user stream handle (NULL/LEGACY/PER_THREAD -> device's default stream).
Stream* resolve_stream(State& s, CUstream h, int default_device) noexcept;
void progress(State& s);
void force_complete(State& s, Stream& st, uint64_t upto);
void complete_device(State& s, int device);

// The protection of [va, va+len) follows the bookkeeping again (after a change or a failure).
bool sync_host_protection(State& s, uintptr_t va, size_t len);

}  // namespace expanse::sim::detail
