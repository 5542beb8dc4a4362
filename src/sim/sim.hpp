// sim/ — a software CUDA driver for the VMM subset of the CUDA Driver API (cuda.h 13.0).
//
// Same C signatures and the same CUresult codes for the same misuse as the real driver. Physical
// pages are host memory (one sparse memfd per device): a device pointer is readable and writable
// from the host after cuMemSetAccess, faults when unmapped or never granted. Every entry point
// counts its calls, failures can be injected at the Nth call of any entry point, and a cost model
// turns the calls into a modeled GPU driver time.
//
// This header is the in-process control surface used by driver/ (to get the table) and by tests.
// The same functions are exported with C linkage from libexpanse_simcuda.so (see
// export/expanse_sim_control.h); the entry points themselves are declared in sim_entry.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "conf/sim_options.hpp"
#include "driver_api/cost_model.hpp"
#include "driver_api/driver_table.hpp"

namespace expanse::sim {

// The sim's configuration: the sim_* keys of EXPANSE_CONF (conf/sim_options.hpp parses them).
using SimConfig = conf::SimOptions;

// Parses the sim_* keys of an EXPANSE_CONF string (conf::parse_sim_options).
inline SimConfig sim_config_from_string(const std::string& conf) {
  return conf::parse_sim_options(conf);
}

// Replaces the whole sim state with a fresh one using cfg. Everything outstanding (reservations,
// handles, mappings, contexts, streams, events, counters, injections) is dropped, and the policy
// and cost table go back to their defaults; the new sim is not initialized (cuInit first).
// Tests call it between cases; the driver loader calls it once when the sim is selected.
// Throws std::invalid_argument for an impossible cfg (then the old state stays).
void reset(const SimConfig& cfg = SimConfig{});
const SimConfig& config();

// The in-process sim's entry points, every slot filled.
const driver::DriverTable& table();

// --- call accounting -------------------------------------------------------------------------
// Every call counts, failing and injected ones included (legacy variants such as the 32-bit
// cuMemGetInfo count under their base name's entry point).
uint64_t call_count(driver::EntryPoint e);
uint64_t total_calls();
// Zeroes the counters and the modeled time.
void reset_counts();

// --- failure injection -----------------------------------------------------------------------
// The nth call of e from now on (1 = the very next call) returns code without doing anything.
// Throws std::invalid_argument for nth == 0.
void inject_failure(driver::EntryPoint e, uint64_t nth, CUresult code);
void clear_injections();

// --- a neighbour on the same device ---------------------------------------------------------
// Another process sharing the device: the memory it holds counts as used in cuMemGetInfo and is
// not there for cuMemCreate, as on a shared GPU. A test plays a greedy neighbour with a hook
// that takes free memory between this process's calls.
class Neighbour {
 public:
  // Takes up to `bytes` of device's free memory (SIZE_MAX: all of it); returns what it took.
  size_t take(int device, size_t bytes);
  // Gives back up to `bytes` of what it holds on device (SIZE_MAX: all); returns what it gave.
  size_t give(int device, size_t bytes);
  size_t holds(int device) const;
  // What cuMemGetInfo would say is free on device now.
  size_t free_bytes(int device) const;

 private:
  friend struct NeighbourAccess;
  explicit Neighbour(void* state) : state_(state) {}
  void* state_;
};
// Runs after every call the sim answers under its lock (every VMM entry point, cuMemGetInfo,
// streams and events; not the lock-free cuStreamGetId and cuStreamIsCapturing answers), with
// the call's entry point and result, while the lock is held: it must not call the sim's entry
// points, only `n`. An empty hook removes it; reset() does too.
using NeighbourHook = std::function<void(driver::EntryPoint e, CUresult r, Neighbour& n)>;
void set_neighbour(NeighbourHook hook);
// The same as the hook's Neighbour, between calls (takes the sim's lock). Throws
// std::invalid_argument for a device that does not exist.
size_t neighbour_take(int device, size_t bytes);
size_t neighbour_give(int device, size_t bytes);
size_t neighbour_holds(int device);

// --- modeled GPU driver time -----------------------------------------------------------------
// A per-call and a per-byte part per entry point (driver_api/cost_model.hpp); ranges of several
// mappings cost one call per mapping unless the table has a range curve; cuMemSetAccess counts
// once per descriptor. Default: driver::CostModel::get_default() at start-up (the H100 table).
using CostTable = driver::CostModel;
void set_cost_table(const CostTable& t);
double modeled_seconds();

// --- streams and events: holding work pending -------------------------------------------------
// Work recorded on a held stream (cuEventRecord) stays incomplete: cuEventQuery / cuStreamQuery
// answer CUDA_ERROR_NOT_READY until release_stream(). cuStreamSynchronize / cuEventSynchronize /
// cuCtxSynchronize wait for the work, i.e. they complete it (a held stream's work finishes when
// somebody waits for it, as on a GPU). stream is a live stream handle, NULL or CU_STREAM_LEGACY
// (the legacy stream of the calling thread's current context, device 0's without one) or
// CU_STREAM_PER_THREAD (the calling thread's per-thread stream of that context, made on first
// use). A destroyed stream stays held, its work pending, until a synchronize covers it (its
// context's, or an event it recorded) or release_all(); its handle value may meanwhile name a
// new stream (cuStreamCreate recycles values), which it is then release_stream's to release.
// Asynchronous copies and memsets are work items too (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync,
// cuMemsetD8Async): queued behind pending work, their bytes move only when they complete, so
// data copied on a held stream cannot be read before the hold is released or a synchronize
// completes it. A DtoH copy into pageable memory (not pinned: cuMemHostAlloc, cuMemHostRegister,
// or HOST_NUMA pages mapped for the device) waits for its stream, as the driver does, so it
// completes a held stream's work; an HtoD copy from pageable memory reads its source at the call
// (the driver's staging buffer). See sim_vmm.cpp.
// Throws std::invalid_argument for a handle that names no stream.
void hold_stream(CUstream stream);
void release_stream(CUstream stream);
// Releases every held stream, destroyed ones and other threads' per-thread streams included.
void release_all();
// The host clock that a GPU running behind follows (SimConfig::gpu_lag, EXPANSE_CONF
// sim_gpu_lag): work issued on any stream at tick t completes once the clock reaches
// t + gpu_lag (and what it waits for has completed, and its stream is not held). The clock
// starts at 0 and moves only here: a replay advances it once per operation of its trace.
// With gpu_lag 0 the clock changes nothing.
void advance_host_clock(uint64_t ticks);
uint64_t host_clock();
// Number of events recorded but not complete, over all streams.
size_t pending_events();
// Asynchronous copies / memsets (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemsetD8Async) whose
// device range was no longer mapped with the access they need when their stream ran them (the
// range was unmapped, or its access taken, while they were pending): an illegal-address fault on
// a GPU (sticky, asynchronous). The sim skips such a copy and counts it here; code that never
// unmaps pages under pending work (invariant 3) keeps this at 0.
uint64_t async_faults();
// Calls so far that named a destroyed stream whose handle value no new stream took: undefined
// behaviour on a real driver (seen: 709, then a crash inside libcuda). Code that keeps stream
// handles (an allocator) must never cause one.
uint64_t dead_handle_uses();
// The latest (up to 16) captures that cuStreamEndCapture found invalidated, one line each:
// which capture, and which entry point, called from which thread in which capture mode,
// invalidated it ("capture 7 (THREAD_LOCAL, device 0, ...) was invalidated by cuCtxSynchronize
// on thread 3 in mode RELAXED"). Empty when none was.
std::string capture_log();

// Whether the calling thread is inside a sim entry point now (in-process only). A driver's own
// host memory is not the application's heap (libcuda allocates with its own malloc): tests that
// make the application's operator new fail (test/support/host_alloc_failure.hpp) let the sim's
// allocations through, so that the sim never fails half done where the real driver would not.
bool inside_call() noexcept;

// --- what is outstanding ---------------------------------------------------------------------
struct Outstanding {
  size_t reservations = 0;
  size_t reserved_bytes = 0;
  size_t allocations = 0;     // physical allocations not yet freed
  size_t physical_bytes = 0;  // bytes counted as used by cuMemGetInfo
  size_t mappings = 0;
  size_t mapped_bytes = 0;
  size_t streams = 0;
  size_t events = 0;
  size_t host_allocations = 0;  // pinned host memory (cuMemHostAlloc) not yet freed
  size_t host_bytes = 0;        // their bytes, as asked for (never per device)
  size_t host_numa_allocations = 0;  // HOST_NUMA handles (cuMemCreate) not yet freed
  size_t host_numa_bytes = 0;        // their bytes: host pages, apart from every device's
  size_t host_registrations = 0;     // cuMemHostRegister ranges not yet unregistered
  size_t host_registered_bytes = 0;
  bool empty() const noexcept {
    return reservations == 0 && allocations == 0 && mappings == 0 && physical_bytes == 0 &&
           host_allocations == 0 && host_numa_allocations == 0 && host_registrations == 0;
  }
};
// -1: all devices. Reservations belong to no device and are reported for every device.
Outstanding outstanding(int device = -1);
// One summary line plus one line per outstanding reservation/allocation/mapping (first 16 each).
std::string describe_outstanding();

// Bytes of host RAM behind the physical pages of device (-1: all): what the memfds hold now.
size_t resident_bytes(int device = -1);

// Strictness switches for corners the CUDA documentation leaves undefined. Defaults are strict.
struct Policy {
  bool free_with_mappings_is_error = true;  // cuMemAddressFree over live mappings → INVALID_VALUE
  // One mapping over adjacent reservations: allowed, as the real driver does (measured on H100,
  // driver 580.159.04, 2026-11-23); true makes it INVALID_VALUE.
  bool map_across_reservations_is_error = false;
  bool require_context_for_vmm = false;  // VMM calls with no current context are allowed
};
void set_policy(const Policy& p);

}  // namespace expanse::sim
