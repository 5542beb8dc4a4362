// The sim's state (internal to sim/). One State object holds everything; reset() replaces it.
// Every access happens with state_mutex() held.
#pragma once

#include <sys/types.h>

#include <type_traits>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/host_backing.hpp"
#include "sim/sim.hpp"

namespace expanse::sim::detail {

constexpr int kMaxDevices = conf::kMaxSimDevices;

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
  int host = 0;  // CU_MEM_ACCESS_FLAGS_PROT_* of the host (HOST_NUMA descriptors; host memory)
  bool operator==(const AccessBits& o) const noexcept {
    return read == o.read && write == o.write && host == o.host;
  }
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
  // What the host (standing in for every device) may do: the union over devices and the host.
  int host_flags() const noexcept {
    return write != 0 || host == 3 ? 3 : (read != 0 || host == 1 ? 1 : 0);
  }
};

// The device memory behind an exported allocation, counted once in its device's physical_used
// while any handle of it lives in this process: the creator's and every import of its fd here
// share one record (the driver frees memory when its last handle and mapping go, whichever).
struct MemoryRecord {
  int device = 0;
  size_t size = 0;
  std::pair<uint64_t, uint64_t> file;  // the memfd's (st_dev, st_ino): State::exported's key
};

struct Allocation {
  Allocation() = default;
  ~Allocation();  // closes own_fd
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  CUmemGenericAllocationHandle handle = 0;
  int device = 0;     // the device ordinal, or the NUMA node of host memory
  bool host = false;  // created on a host NUMA node (CU_MEM_LOCATION_TYPE_HOST_NUMA)
  size_t size = 0;
  CUmemAllocationProp prop{};
  uint64_t user_refs = 0;  // cuMemCreate + cuMemRetainAllocationHandle + import - cuMemRelease
  uint64_t map_refs = 0;   // live mappings
  uint64_t offset = 0;     // extent in the device's memfd (backing only; own_fd < 0)
  // A memfd of its own, made at its first export (or the importer's copy of the exported fd):
  // its bytes live there from then on, at offset 0, whatever the backing.
  int own_fd = -1;
  // Imported (cuMemImportFromShareableHandle): the memory is counted by the process that created
  // it, not in this device's physical_used (unless that is this process: see memory).
  bool imported = false;
  // Exported, or imported from an fd this process exported: physical_used counts the record,
  // released with its last holder (maybe_free).
  std::shared_ptr<MemoryRecord> memory;
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
  uint64_t id = 0;  // cuCtxGetId; a new one each time the primary context is (re)created
};

struct Stream;
struct State;

// One stream capture sequence (cuStreamBeginCapture .. cuStreamEndCapture). Streams that wait on
// an event recorded in it join it; work recorded into it is captured, never executed.
struct Capture {
  uint64_t id = 0;  // unique over the process (cuStreamGetCaptureInfo)
  int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t thread = 0;  // the thread that began it
  int device = 0;       // its context
  bool invalidated = false;
  std::string invalidated_by;  // the call (and thread) that invalidated it, for capture_log()
  bool ended = false;  // cuStreamEndCapture was called (or its context was reset)
  // Another thread's cuStreamEndCapture was refused (WRONG_THREAD): the origin's end then
  // answers ILLEGAL_STATE with no graph (measured: H100, driver 580).
  bool foreign_end_refused = false;
  CUgraph graph = nullptr;  // the graph being captured into, handed over at cuStreamEndCapture
  Stream* origin = nullptr;
  std::vector<std::shared_ptr<Stream>> members;  // origin and joined streams (cleared at end)
};

// A stream is an ordered list of work items (seq 1, 2, ...). An item completes when every item
// before it on its stream has completed, its stream is not held, and its dependencies (items on
// other streams) have completed. Synchronizing forces completion regardless of holds.
struct Stream : std::enable_shared_from_this<Stream> {
  struct Dep {
    std::shared_ptr<Stream> stream;
    uint64_t seq = 0;
  };
  // What a work item does when it completes (an async copy or memset; empty for event records
  // and waits), and the host bytes it touches ([host_lo, host_hi), for cuMemFreeHost to wait for).
  using Effect = std::function<void(State&)>;
  struct Item {
    uint64_t seq = 0;
    std::vector<Dep> deps;
    Effect effect;
    uintptr_t host_lo = 0;
    uintptr_t host_hi = 0;
    uint64_t due = 0;  // the host clock at which the GPU reaches it (State::host_clock)
  };
  CUstream handle = nullptr;  // the value handed out (CU_STREAM_LEGACY / _PER_THREAD for those)
  uint64_t id = 0;            // cuStreamGetId: unique over the process, never reused
  int device = 0;             // its context (the device's primary context)
  unsigned flags = 0;
  bool is_default = false;  // the legacy NULL stream of its device
  bool per_thread = false;  // a per-thread default stream (CU_STREAM_PER_THREAD)
  bool held = false;
  std::shared_ptr<Capture> capture;  // the capture sequence it takes part in, if any
  // While capturing: graph nodes captured on it so far, and for each member stream the number
  // of its nodes that this stream's dependency set covers (itself included); an event recorded
  // here copies the map, a wait on it merges it (cuStreamEndCapture: UNJOINED otherwise).
  uint64_t capture_nodes = 0;
  std::map<const Stream*, uint64_t> capture_reach;
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
  std::shared_ptr<Capture> captured;  // last recorded inside this capture sequence
  std::map<const Stream*, uint64_t> captured_reach;  // its stream's capture_reach then
  bool complete() const noexcept { return !stream || stream->done_seq >= seq; }
};

// Pinned host memory from cuMemHostAlloc (an anonymous host mapping of `mapped` bytes).
struct HostAllocation {
  size_t size = 0;    // as asked for
  size_t mapped = 0;  // rounded up to the host page size
  unsigned flags = 0;
};

struct Device {
  int ordinal = 0;
  Context ctx;
  int primary_refs = 0;
  size_t physical_used = 0;  // this process's memory and the neighbour's (sim.hpp)
  size_t neighbour = 0;       // of it, held by the neighbour
  std::shared_ptr<Stream> default_stream;
  PhysicalStore store;
};

struct State {
  explicit State(const SimConfig& c);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  SimConfig cfg;
  // The host clock (sim::advance_host_clock): work issued at tick t is due at t + cfg.gpu_lag.
  uint64_t host_clock = 0;
  Policy policy;
  CostTable costs;
  bool initialized = false;
  pid_t init_pid = 0;  // the process whose cuInit initialized this State (fork: see run())
  uint64_t generation = 0;  // identifies this State to thread-local context stacks

  std::vector<std::unique_ptr<Device>> devices;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::unordered_map<CUmemGenericAllocationHandle, std::unique_ptr<Allocation>> allocations;
  // The memory records of allocations exported from this process, by their memfd's identity.
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<MemoryRecord>> exported;
  size_t mapped_bytes = 0;
  std::map<uintptr_t, HostAllocation> host_allocations;  // by base address
  size_t host_used = 0;       // bytes of host_allocations, against cfg.host_capacity
  size_t host_numa_used = 0;  // bytes of HOST_NUMA handles, against it too
  std::map<uintptr_t, size_t> host_registered;  // cuMemHostRegister: base -> bytes
  size_t host_registered_used = 0;              // their bytes, against it too
  std::vector<std::unique_ptr<PhysicalStore>> host_stores;  // one per NUMA node, opened on use
  uint64_t async_faults = 0;  // sim::async_faults()

  // Live created streams and events by handle value. Values are recycled: a create hands out
  // the most recently freed value first (as the real driver's allocator tends to).
  std::unordered_map<uintptr_t, std::shared_ptr<Stream>> streams;
  std::unordered_map<const Stream*, std::shared_ptr<Stream>> busy;  // any stream with pending work
  std::unordered_map<uintptr_t, std::unique_ptr<Event>> events;
  std::vector<uintptr_t> free_stream_handles;  // most recently freed last
  std::vector<uintptr_t> free_event_handles;
  uintptr_t next_stream_handle = 0;
  uintptr_t next_event_handle = 0;
  // What using a freed handle value returns until it is handed out again: INVALID_HANDLE after
  // cuStreamDestroy / cuEventDestroy, CONTEXT_IS_DESTROYED after its context was reset.
  std::unordered_map<uintptr_t, CUresult> dead_streams;
  // Calls that named a destroyed stream handle no stream took over: undefined behaviour on a
  // real driver (a 580 driver answered 709 once, then crashed in cuStreamIsCapturing), so
  // tests of code that must never do it check this stays 0 (dead_handle_uses()).
  uint64_t dead_handle_uses = 0;
  std::unordered_map<uintptr_t, CUresult> dead_events;
  // Per-thread default streams, made on first use: (thread token, device) -> stream.
  std::map<std::pair<uint64_t, int>, std::shared_ptr<Stream>> per_thread_streams;
  uint64_t next_stream_id = 1;
  uint64_t next_capture_id = 1;
  uint64_t next_ctx_id = 1;
  // Graphs returned by cuStreamEndCapture (or still being captured into), by handle value.
  std::map<uintptr_t, bool> graphs;  // value: owned by the user (false while capturing)
  uintptr_t next_graph_handle = 0;
  std::vector<std::shared_ptr<Capture>> captures;  // capture sequences under way
  // The latest captures that cuStreamEndCapture found invalidated, and by what (capture_log()).
  std::deque<std::string> invalidated_captures;

  std::array<std::map<uint64_t, CUresult>, kEntryCount> injections;  // call number -> code
  NeighbourHook neighbour_hook;  // sim::set_neighbour
  std::array<uint64_t, kEntryCount> calls_seen{};  // monotonic, not cleared by reset_counts
  double modeled_ns = 0;
  // fast_calls(stream_get_id) when modeled_ns last included them (priced on reading).
  uint64_t fast_priced = 0;
  uint64_t fast_priced_capturing = 0;  // the same for cuStreamIsCapturing
};

// The global lock and the current state (created on first use with the default config).
std::mutex& state_mutex() noexcept;
State& state_locked();
// Call counters, readable without the lock.
std::atomic<uint64_t>* call_counters() noexcept;

// A thread's context stack. Trivially destructible, so that it is never destroyed: a static
// object's destructor that calls the driver at exit runs after the thread's thread_local
// destructors (a std::vector here was used after free by ~DeviceAllocator at exit).
class ContextStack {
 public:
  static constexpr size_t kCapacity = 1024;
  bool empty() const noexcept { return size_ == 0; }
  Context*& back() noexcept { return items_[size_ - 1]; }
  // False when full (cuCtxPushCurrent then fails with CUDA_ERROR_OUT_OF_MEMORY).
  bool push_back(Context* c) noexcept {
    if (size_ == kCapacity) return false;
    items_[size_++] = c;
    return true;
  }
  void pop_back() noexcept { --size_; }
  void clear() noexcept { size_ = 0; }

 private:
  Context* items_[kCapacity];
  size_t size_;
};
static_assert(std::is_trivially_destructible_v<ContextStack>);

// The calling thread's context stack (emptied when the state it belonged to was replaced).
ContextStack& context_stack(State& s);
// Resolves a context handle against the live state; nullptr if it is not one of ours.
Context* find_context(State& s, CUcontext ctx) noexcept;
// The device of the calling thread's current context, or -1 if there is none (or it was released).
int current_device(State& s) noexcept;
// The top of the calling thread's context stack as it stands, without the lock (nullptr when
// empty); possibly left from a state since replaced: compare it, never follow it.
const Context* current_context_unlocked() noexcept;

// A token unique to the calling thread (never reused), for per-thread state.
uint64_t thread_token() noexcept;

// Streams/events bookkeeping used by both the entry points and the control API.
// Resolves a user stream handle: NULL and CU_STREAM_LEGACY -> the device's legacy stream,
// CU_STREAM_PER_THREAD -> the calling thread's per-thread stream of the device (made on first
// use), others -> the live created stream with that handle value (nullptr if none).
Stream* resolve_stream(State& s, CUstream h, int default_device);
// What a stream handle that resolve_stream does not know answers (see State::dead_streams).
CUresult dead_stream_code(State& s, CUstream h) noexcept;
void progress(State& s);
void force_complete(State& s, Stream& st, uint64_t upto);
void complete_device(State& s, int device);
// Completes (in order, as a synchronize does) every pending work item whose host bytes overlap
// [lo, hi), and what each depends on.
void complete_host_range(State& s, uintptr_t lo, uintptr_t hi);

// Work for streams (sim_streams.cpp): st waits for e (joins e's capture when e was recorded in
// one), and e is recorded on st; both answer the driver's code.
CUresult wait_event(State& s, Stream& st, Event& e, unsigned flags);
CUresult record_event(State& s, Stream& st, Event& e);
// A stream argument of a call that puts work on it: NULL, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD name the current context's (INVALID_CONTEXT without one).
CUresult work_stream_arg(State& s, CUstream h, Stream** out);
// Puts a work item with an effect on st: it runs when the item completes (at once unless st is
// held or waits for other work). *captured: st is capturing, the work became a graph node and
// will never run. *seq: the item (0 when captured). The driver's code otherwise (IMPLICIT for
// the legacy stream while a blocking stream captures, INVALIDATED on an invalidated capture).
CUresult submit_work(State& s, Stream& st, Stream::Effect effect, uintptr_t host_lo,
                     uintptr_t host_hi, uint64_t* seq, bool* captured);

// ---- device handles ----
// The CUdevice that cuDeviceGet hands out for an ordinal, and back (-1: not a device of s).
CUdevice device_handle(int ordinal) noexcept;
int device_ordinal(const State& s, CUdevice dev) noexcept;

// ---- cuStreamGetId without the lock (sim_fast_path.cpp) ----
// The cached answer for a created stream's handle, when nothing removed a stream since it was
// cached and no failure is injected for cuStreamGetId; false: make the locked call.
bool fast_stream_id(CUstream h, unsigned long long* id) noexcept;
// With the lock held, after a locked cuStreamGetId of h answered id.
void remember_stream_id(CUstream h, uint64_t id) noexcept;
// With the lock held: a handle stopped naming its stream (destroy, context reset, sim reset).
// A context reset calls it whatever it drops: NULL / PER_THREAD answers cached for it go too.
void forget_stream_ids() noexcept;
// cuStreamIsCapturing without the lock (sim_fast_path.cpp): true when a cached "not capturing"
// answer still holds; remember one after a locked answer; every capture begun or joined bumps
// the capture epoch first.
bool fast_not_capturing(CUstream h, CUstreamCaptureStatus* status) noexcept;
void remember_not_capturing(CUstream h) noexcept;
void capture_membership_changed() noexcept;
// Calls of e answered without the lock, ever, over all threads (0 for other entry points).
uint64_t fast_calls(driver::EntryPoint e) noexcept;
// With the lock held: whether failures are injected for e (the fast path steps aside).
void set_injection_armed(driver::EntryPoint e, bool armed) noexcept;

// ---- stream capture (sim_capture.cpp) ----
// The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode).
int& thread_capture_mode(const State& s) noexcept;
// The state of a stream's capture: NONE, ACTIVE or INVALIDATED.
CUstreamCaptureStatus capture_status(const Stream& st) noexcept;
// Marks a capture sequence invalidated (cuStreamEndCapture then fails), remembering the entry
// point running on the calling thread (CallScope) as the culprit.
void invalidate(Capture& c) noexcept;
// The entry point the calling thread is running (set by run()), nullptr outside one.
const char*& current_call() noexcept;
// Whether a blocking (not CU_STREAM_NON_BLOCKING) stream of device's context is capturing: the
// legacy stream is then unusable (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
bool blocking_capture_in(const State& s, int device) noexcept;
// Invalidates every capture with a blocking stream of device (implicit legacy dependency).
void invalidate_blocking_captures(State& s, int device) noexcept;
// For a "potentially unsafe" call (cuMemUnmap, cuMemRelease, ... see sim_capture.cpp): SUCCESS, or
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED after invalidating the capture(s) that forbid it, as
// the calling thread's capture mode and the captures under way decide.
CUresult check_unsafe_call(State& s) noexcept;
// For synchronizing a whole context: UNSUPPORTED while any stream of it captures (every such
// capture is invalidated), else what check_unsafe_call says.
CUresult context_sync_check(State& s, int device) noexcept;
// Ends every capture (a reset of the context, or of the sim).
void drop_captures(State& s, int device) noexcept;
// Fork/join bookkeeping (see Stream::capture_reach): st takes part in e's capture and now
// depends on what e recorded; st captured a graph node; e is recorded on capturing st.
void capture_join(Stream& st, const Event& e);
void capture_node(Stream& st);
void capture_record(Event& e, const Stream& st);

// ---- physical allocations and mappings (sim_vmm.cpp) ----
// A handle value that names an allocation with user references left; nullptr otherwise.
Allocation* live_handle(State& s, CUmemGenericAllocationHandle h);
// Frees the physical memory once nothing refers to it any more.
void maybe_free(State& s, Allocation* a);
// The mapping containing va, or s.mappings.end().
std::map<uintptr_t, Mapping>::iterator mapping_at(State& s, uintptr_t va);
// A handle value never handed out before in this process.
CUmemGenericAllocationHandle next_handle() noexcept;

// The protection of [va, va+len) follows the bookkeeping again (after a change or a failure).
bool sync_host_protection(State& s, uintptr_t va, size_t len);

}  // namespace expanse::sim::detail
