// The sim's driver entry points (spec: shared/reference/cuda_vmm_spec.md §3-§7, policies §10).
//
// Every entry point runs under the global lock: it counts the call, fires an injected failure if
// one is due (no side effects), checks cuInit, runs its body and, on success, adds its modeled
// cost. Misuse is answered with the code of the spec's misuse table, before any state changes.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "sim/sim_entry.hpp"
#include "sim/sim_errors.hpp"
#include "sim/sim_internal.hpp"

namespace expanse::sim {
namespace {

using detail::AccessBits;
using detail::Allocation;
using detail::Context;
using detail::Device;
using detail::Event;
using detail::Mapping;
using detail::State;
using detail::Stream;
using driver::EntryPoint;

std::atomic<uint64_t> g_handle_serial{0};

// Handle values are never reused within a process, so a stale handle never aliases a new one.
CUmemGenericAllocationHandle next_handle() noexcept {
  const uint64_t n = g_handle_serial.fetch_add(1) + 1;
  return (uint64_t{0x51} << 40) | (n << 4);
}

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

bool valid_device(const State& s, int d) noexcept {
  return d >= 0 && d < static_cast<int>(s.devices.size());
}

Device& device(State& s, int d) { return *s.devices[static_cast<size_t>(d)]; }

bool vmm_context_ok(State& s) {
  return !s.policy.require_context_for_vmm || detail::current_device(s) >= 0;
}

bool aligned(uint64_t v, uint64_t a) noexcept { return v % a == 0; }

double pages(const State& s, size_t bytes) noexcept {
  return static_cast<double>(bytes / s.cfg.granularity);
}

// ---- device attributes --------------------------------------------------------------------------

// An A100-80GB-like device (compute capability 8.0) that supports VMM and nothing that needs
// hardware: no export handle types, no RDMA, no compression, no multicast, no host VMM.
bool device_attribute(int attr, int* value) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 49152; return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *value = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1410000; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *value = 512; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 108; return true;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *value = CU_COMPUTEMODE_DEFAULT; return true;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: *value = 512; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = 0; return true;  // replaced by the caller
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 1593000; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 41943040; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *value = 3; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *value = 32; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 8; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = 167936; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: *value = 2; return true;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 166912; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *value = 32; return true;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: *value = 31457280; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: *value = 134213632; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: *value = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: *value = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: *value = -1; return true;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *value = -1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: *value = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 0; return true;
    default: return false;
  }
}

// ---- VMM helpers --------------------------------------------------------------------------------

Allocation* live_handle(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.allocations.find(h);
  if (it == s.allocations.end() || it->second->user_refs == 0) return nullptr;
  return it->second.get();
}

// Frees the physical memory once nothing refers to it any more.
void maybe_free(State& s, Allocation* a) {
  if (a->user_refs != 0 || a->map_refs != 0) return;
  Device& d = device(s, a->device);
  d.physical_used -= a->size;
  if (s.cfg.backing) d.store.free(a->offset, a->size);
  s.allocations.erase(a->handle);
}

// The mapping containing va, or end().
std::map<uintptr_t, Mapping>::iterator mapping_at(State& s, uintptr_t va) {
  auto it = s.mappings.upper_bound(va);
  if (it == s.mappings.begin()) return s.mappings.end();
  --it;
  return va < it->first + it->second.size ? it : s.mappings.end();
}

// [lo, hi) inside one reservation (or, if allow_span, inside adjacent reservations).
bool inside_reservations(const State& s, uintptr_t lo, uintptr_t hi, bool allow_span) {
  auto it = s.reservations.upper_bound(lo);
  if (it == s.reservations.begin()) return false;
  --it;
  uintptr_t end = it->first + it->second.size;
  if (lo >= end) return false;
  while (hi > end) {
    if (!allow_span) return false;
    ++it;
    if (it == s.reservations.end() || it->first != end) return false;
    end = it->first + it->second.size;
  }
  return true;
}

bool overlaps_mapping(const State& s, uintptr_t lo, uintptr_t hi) {
  auto it = s.mappings.lower_bound(lo);
  if (it != s.mappings.end() && it->first < hi) return true;
  if (it != s.mappings.begin()) {
    --it;
    if (it->first + it->second.size > lo) return true;
  }
  return false;
}

// The mappings that tile [lo, hi) exactly (whole mappings, no gaps), or an empty vector.
std::vector<std::map<uintptr_t, Mapping>::iterator> whole_mappings(State& s, uintptr_t lo,
                                                                   uintptr_t hi) {
  std::vector<std::map<uintptr_t, Mapping>::iterator> out;
  auto it = s.mappings.find(lo);
  uintptr_t cur = lo;
  while (cur < hi) {
    if (it == s.mappings.end() || it->first != cur) return {};
    cur += it->second.size;
    if (cur > hi) return {};
    out.push_back(it);
    ++it;
  }
  return out;
}

// Removes whole mappings [lo, hi) (already validated): host VA back to reserved, references
// dropped.
CUresult unmap_range(State& s, uintptr_t lo, uintptr_t hi,
                     const std::vector<std::map<uintptr_t, Mapping>::iterator>& ms) {
  if (s.cfg.backing && !detail::va_unmap_to_reserved(lo, hi - lo)) return CUDA_ERROR_OUT_OF_MEMORY;
  for (auto it : ms) {
    Allocation* a = it->second.alloc;
    s.mapped_bytes -= it->second.size;
    s.mappings.erase(it);
    --a->map_refs;
    maybe_free(s, a);
  }
  return CUDA_SUCCESS;
}

void split_run(Mapping& m, size_t off) {
  if (off >= m.size) return;
  auto it = m.access.upper_bound(off);
  --it;  // the run containing off (key 0 always exists)
  if (it->first != off) m.access.emplace_hint(std::next(it), off, it->second);
}

void merge_runs(Mapping& m) {
  auto it = m.access.begin();
  while (it != m.access.end()) {
    auto next = std::next(it);
    if (next != m.access.end() && next->second == it->second) {
      m.access.erase(next);
    } else {
      it = next;
    }
  }
}

// ---- stream helpers -----------------------------------------------------------------------------

bool special_stream(CUstream h) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  return raw == 0 || raw == 1 || raw == 2;
}

// Resolves a stream argument; special streams need a current context (INVALID_CONTEXT) unless
// default_device is given.
CUresult stream_arg(State& s, CUstream h, int default_device, Stream** out) {
  if (special_stream(h)) {
    if (default_device < 0) default_device = detail::current_device(s);
    if (default_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  Stream* st = detail::resolve_stream(s, h, default_device);
  if (st == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *out = st;
  return CUDA_SUCCESS;
}

Event* event_arg(State& s, CUevent h) {
  auto it = s.events.find(reinterpret_cast<const Event*>(h));
  return it == s.events.end() ? nullptr : it->second.get();
}

// Appends a work item to st. Legacy default-stream semantics: work on the NULL stream waits for
// all blocking streams of its device, and work on a blocking stream waits for the NULL stream.
uint64_t enqueue(State& s, Stream& st, std::vector<Stream::Dep> deps) {
  if (st.is_default) {
    for (auto& [key, other] : s.busy) {
      if (other->device == st.device && !other->is_default &&
          (other->flags & CU_STREAM_NON_BLOCKING) == 0 && !other->pending.empty()) {
        deps.push_back({other, other->last_seq()});
      }
    }
  } else if ((st.flags & CU_STREAM_NON_BLOCKING) == 0) {
    auto& def = device(s, st.device).default_stream;
    if (!def->pending.empty()) deps.push_back({def, def->last_seq()});
  }
  Stream::Item item;
  item.seq = st.next_seq++;
  item.deps = std::move(deps);
  st.pending.push_back(std::move(item));
  s.busy[&st] = st.shared_from_this();
  detail::progress(s);
  return st.next_seq - 1;
}

// Drops a device's streams and events (its primary context was reset).
void reset_device_context(State& s, int d) {
  detail::complete_device(s, d);
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->device == d) {
      it->second->destroyed = true;
      it = s.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    it = it->second->device == d ? s.events.erase(it) : std::next(it);
  }
  device(s, d).default_stream->held = false;
}

}  // namespace

// ---- errors, init, version ----------------------------------------------------------------------

CUresult sim_get_error_name(CUresult error, const char** str) {
  return run(EntryPoint::get_error_name, false, [&](State&, double&) {
    if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *str = detail::error_name(detail::bits(error));
    return *str == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  });
}

CUresult sim_get_error_string(CUresult error, const char** str) {
  return run(EntryPoint::get_error_string, false, [&](State&, double&) {
    if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *str = detail::error_string(detail::bits(error));
    return *str == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  });
}

CUresult sim_init(unsigned int flags) {
  return run(EntryPoint::init, false, [&](State& s, double&) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (s.devices.empty()) return CUDA_ERROR_NO_DEVICE;
    s.initialized = true;
    return CUDA_SUCCESS;
  });
}

CUresult sim_driver_get_version(int* version) {
  return run(EntryPoint::driver_get_version, false, [&](State& s, double&) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = s.cfg.driver_version;
    return CUDA_SUCCESS;
  });
}

// ---- devices ------------------------------------------------------------------------------------

CUresult sim_device_get(CUdevice* dev, int ordinal) {
  return run(EntryPoint::device_get, true, [&](State& s, double&) {
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_count(int* count) {
  return run(EntryPoint::device_get_count, true, [&](State& s, double&) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(s.devices.size());
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_attribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  return run(EntryPoint::device_get_attribute, true, [&](State& s, double&) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    const int a = detail::bits(attrib);
    if (a <= 0 || a >= static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX)) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    if (!device_attribute(a, &v)) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) v = dev + 1;
    *value = v;
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_name(char* name, int len, CUdevice dev) {
  return run(EntryPoint::device_get_name, true, [&](State& s, double&) {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "expanse sim device %d", dev);
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_total_mem(size_t* bytes, CUdevice dev) {
  return run(EntryPoint::device_total_mem, true, [&](State& s, double&) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = s.cfg.capacity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_total_mem_v1(unsigned int* bytes, CUdevice dev) {
  return run(EntryPoint::device_total_mem, true, [&](State& s, double&) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = static_cast<unsigned int>(std::min<size_t>(s.cfg.capacity, UINT_MAX));
    return CUDA_SUCCESS;
  });
}

// ---- contexts -----------------------------------------------------------------------------------

CUresult sim_device_primary_ctx_retain(CUcontext* ctx, CUdevice dev) {
  return run(EntryPoint::device_primary_ctx_retain, true, [&](State& s, double&) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    Device& d = device(s, dev);
    ++d.primary_refs;
    *ctx = reinterpret_cast<CUcontext>(&d.ctx);
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_primary_ctx_release(CUdevice dev) {
  return run(EntryPoint::device_primary_ctx_release, true, [&](State& s, double&) {
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    Device& d = device(s, dev);
    if (d.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--d.primary_refs == 0) reset_device_context(s, dev);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_get_current(CUcontext* ctx) {
  return run(EntryPoint::ctx_get_current, true, [&](State& s, double&) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& stack = detail::context_stack(s);
    *ctx = stack.empty() ? nullptr : reinterpret_cast<CUcontext>(stack.back());
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_set_current(CUcontext ctx) {
  return run(EntryPoint::ctx_set_current, true, [&](State& s, double&) {
    auto& stack = detail::context_stack(s);
    if (ctx == nullptr) {
      if (!stack.empty()) stack.pop_back();
      return CUDA_SUCCESS;
    }
    Context* c = detail::find_context(s, ctx);
    if (c == nullptr || device(s, c->device).primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (stack.empty()) {
      stack.push_back(c);
    } else {
      stack.back() = c;
    }
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_push_current(CUcontext ctx) {
  return run(EntryPoint::ctx_push_current, true, [&](State& s, double&) {
    Context* c = detail::find_context(s, ctx);
    if (c == nullptr || device(s, c->device).primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    detail::context_stack(s).push_back(c);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_pop_current(CUcontext* ctx) {
  return run(EntryPoint::ctx_pop_current, true, [&](State& s, double&) {
    auto& stack = detail::context_stack(s);
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    Context* c = stack.back();
    stack.pop_back();
    if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(c);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_synchronize() {
  return run(EntryPoint::ctx_synchronize, true, [&](State& s, double&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    detail::complete_device(s, d);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_synchronize_v2(CUcontext ctx) {
  return run(EntryPoint::ctx_synchronize, true, [&](State& s, double&) {
    int d = -1;
    if (ctx == nullptr) {
      d = detail::current_device(s);
    } else if (Context* c = detail::find_context(s, ctx); c != nullptr) {
      d = device(s, c->device).primary_refs > 0 ? c->device : -1;
    }
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    detail::complete_device(s, d);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  return run(EntryPoint::mem_get_info, true, [&](State& s, double&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (free_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = s.cfg.capacity - device(s, d).physical_used;
    if (total_bytes != nullptr) *total_bytes = s.cfg.capacity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_info_v1(unsigned int* free_bytes, unsigned int* total_bytes) {
  return run(EntryPoint::mem_get_info, true, [&](State& s, double&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (free_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const size_t f = s.cfg.capacity - device(s, d).physical_used;
    *free_bytes = static_cast<unsigned int>(std::min<size_t>(f, UINT_MAX));
    if (total_bytes != nullptr) {
      *total_bytes = static_cast<unsigned int>(std::min<size_t>(s.cfg.capacity, UINT_MAX));
    }
    return CUDA_SUCCESS;
  });
}

// ---- VMM: address space -------------------------------------------------------------------------

CUresult sim_mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags) {
  return run(EntryPoint::mem_address_reserve, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const size_t hp = detail::host_page_size();
    if (ptr == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!aligned(size, hp) || !aligned(addr, hp)) return CUDA_ERROR_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    const size_t align = std::max(alignment, s.cfg.granularity);
    const uintptr_t base = detail::va_reserve(size, align, static_cast<uintptr_t>(addr));
    if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    s.reservations[base].size = size;
    *ptr = static_cast<CUdeviceptr>(base);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_address_free(CUdeviceptr ptr, size_t size) {
  return run(EntryPoint::mem_address_free, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const auto base = static_cast<uintptr_t>(ptr);
    auto it = s.reservations.find(base);
    if (it == s.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t end = base + size;
    if (overlaps_mapping(s, base, end)) {
      if (s.policy.free_with_mappings_is_error) return CUDA_ERROR_INVALID_VALUE;
      // Lenient: unmap what is left, one whole mapping at a time (one that starts in the previous
      // reservation, mapped across with the lenient map policy, included).
      auto first = mapping_at(s, base);
      if (first == s.mappings.end()) first = s.mappings.lower_bound(base);
      for (auto m = first; m != s.mappings.end() && m->first < end;) {
        auto next = std::next(m);
        const uintptr_t lo = m->first;
        const uintptr_t hi = lo + m->second.size;
        const CUresult r = unmap_range(s, lo, hi, {m});
        if (r != CUDA_SUCCESS) return r;
        m = next;
      }
    }
    detail::va_release(base, size);
    s.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

// ---- VMM: physical memory -----------------------------------------------------------------------

CUresult sim_mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags) {
  return run(EntryPoint::mem_create, true, [&](State& s, double& units) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr || prop == nullptr || flags != 0 || size == 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (detail::bits(prop->type) != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned kKnownHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                           CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                           CU_MEM_HANDLE_TYPE_FABRIC;
    const auto handle_types = static_cast<unsigned>(detail::bits(prop->requestedHandleTypes));
    if ((handle_types & ~kKnownHandleTypes) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto& af = prop->allocFlags;
    if (af.compressionType > CU_MEM_ALLOCATION_COMP_GENERIC) return CUDA_ERROR_INVALID_VALUE;
    if ((af.usage & ~(CU_MEM_CREATE_USAGE_TILE_POOL | CU_MEM_CREATE_USAGE_HW_DECOMPRESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned char r : af.reserved) {
      if (r != 0) return CUDA_ERROR_INVALID_VALUE;
    }
    switch (detail::bits(prop->location.type)) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!valid_device(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        break;
      case CU_MEM_LOCATION_TYPE_HOST:
        // Not IPC-capable: any handle type is invalid; host VMM itself is not supported (attr 145).
        return handle_types != 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        return prop->location.id < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
      default:  // INVALID, HOST_NUMA_CURRENT, anything else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!aligned(size, s.cfg.granularity)) return CUDA_ERROR_INVALID_VALUE;
    // Export handle types (attrs 103/104/105/128), RDMA (attr 110), tile pools and hardware
    // decompression are not supported by the sim's device.
    if (handle_types != 0 || af.gpuDirectRDMACapable != 0 || af.usage != 0) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const int dev = prop->location.id;
    Device& d = device(s, dev);
    if (size > s.cfg.capacity - d.physical_used) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t offset = 0;
    if (s.cfg.backing) {
      if (!d.store.ensure_open("expanse-sim-device-" + std::to_string(dev), s.cfg.capacity,
                               nullptr) ||
          !d.store.allocate(size, &offset)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    auto a = std::make_unique<Allocation>();
    a->handle = next_handle();
    a->device = dev;
    a->size = size;
    a->prop = *prop;
    a->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;  // attr 107 is 0
    a->user_refs = 1;
    a->offset = offset;
    d.physical_used += size;
    *handle = a->handle;
    s.allocations.emplace(a->handle, std::move(a));
    units = pages(s, size);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_release(CUmemGenericAllocationHandle handle) {
  return run(EntryPoint::mem_release, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    --a->user_refs;
    maybe_free(s, a);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_allocation_granularity(size_t* granularity, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags option) {
  return run(EntryPoint::mem_get_allocation_granularity, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int opt = detail::bits(option);
    if (opt != CU_MEM_ALLOC_GRANULARITY_MINIMUM && opt != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (detail::bits(prop->type) != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (detail::bits(prop->location.type) != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(s, prop->location.id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *granularity = s.cfg.granularity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_allocation_properties_from_handle(CUmemAllocationProp* prop,
                                                       CUmemGenericAllocationHandle handle) {
  return run(EntryPoint::mem_get_allocation_properties_from_handle, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *prop = a->prop;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  return run(EntryPoint::mem_retain_allocation_handle, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = mapping_at(s, reinterpret_cast<uintptr_t>(addr));
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = it->second.alloc;
    ++a->user_refs;  // the handle value is valid again if its references had all gone
    *handle = a->handle;
    return CUDA_SUCCESS;
  });
}

// ---- VMM: mappings ------------------------------------------------------------------------------

CUresult sim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return run(EntryPoint::mem_map, true, [&](State& s, double& units) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != 0 || offset != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    const auto lo = static_cast<uintptr_t>(ptr);
    if (!aligned(lo, s.cfg.granularity) || !aligned(size, s.cfg.granularity))
      return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t hi = lo + size;
    if (hi < lo) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr || size > a->size) return CUDA_ERROR_INVALID_VALUE;
    if (!inside_reservations(s, lo, hi, !s.policy.map_across_reservations_is_error)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (overlaps_mapping(s, lo, hi)) return CUDA_ERROR_INVALID_VALUE;
    if (s.cfg.backing &&
        !detail::va_map_file(lo, size, device(s, a->device).store.fd(), a->offset)) {
      return CUDA_ERROR_OUT_OF_MEMORY;  // the host ran out of mappings (vm.max_map_count)
    }
    Mapping& m = s.mappings[lo];
    m.size = size;
    m.alloc = a;
    m.access.emplace(0, AccessBits{});
    ++a->map_refs;
    s.mapped_bytes += size;
    units = pages(s, size);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_unmap(CUdeviceptr ptr, size_t size) {
  return run(EntryPoint::mem_unmap, true, [&](State& s, double& units) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const auto lo = static_cast<uintptr_t>(ptr);
    const uintptr_t hi = lo + size;
    if (size == 0 || hi < lo) return CUDA_ERROR_INVALID_VALUE;
    const auto ms = whole_mappings(s, lo, hi);
    if (ms.empty()) return CUDA_ERROR_INVALID_VALUE;
    const CUresult r = unmap_range(s, lo, hi, ms);
    if (r == CUDA_SUCCESS) units = pages(s, size);
    return r;
  });
}

CUresult sim_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                            size_t count) {
  return run(EntryPoint::mem_set_access, true, [&](State& s, double& units) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = desc[i];
      const int f = detail::bits(d.flags);
      if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      // All sim allocations are device memory: HOST/HOST_NUMA access descriptors are invalid.
      if (detail::bits(d.location.type) != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
      if (!valid_device(s, d.location.id)) return CUDA_ERROR_INVALID_DEVICE;
    }
    const auto lo = static_cast<uintptr_t>(ptr);
    const uintptr_t hi = lo + size;
    if (size == 0 || hi < lo) return CUDA_ERROR_INVALID_VALUE;
    if (!aligned(lo, s.cfg.granularity) || !aligned(size, s.cfg.granularity))
      return CUDA_ERROR_INVALID_VALUE;
    // Fully mapped: adjacent mappings from lo to hi (a granularity-aligned part of one is fine).
    auto first = mapping_at(s, lo);
    if (first == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::map<uintptr_t, Mapping>::iterator> ms;
    uintptr_t cur = first->first;
    for (auto it = first; cur < hi; ++it) {
      if (it == s.mappings.end() || it->first != cur) return CUDA_ERROR_INVALID_VALUE;
      ms.push_back(it);
      cur += it->second.size;
    }
    std::vector<std::map<size_t, AccessBits>> saved;
    saved.reserve(ms.size());
    for (auto it : ms) {
      Mapping& m = it->second;
      saved.push_back(m.access);
      const size_t off_lo = std::max(lo, it->first) - it->first;
      const size_t off_hi = std::min(hi, it->first + m.size) - it->first;
      split_run(m, off_lo);
      split_run(m, off_hi);
      for (auto run_it = m.access.find(off_lo); run_it != m.access.end() && run_it->first < off_hi;
           ++run_it) {
        for (size_t i = 0; i < count; ++i)
          run_it->second.set(desc[i].location.id, detail::bits(desc[i].flags));
      }
      merge_runs(m);
    }
    if (!detail::sync_host_protection(s, lo, size)) {
      for (size_t i = 0; i < ms.size(); ++i) ms[i]->second.access = std::move(saved[i]);
      detail::sync_host_protection(s, lo, size);
      return CUDA_ERROR_OUT_OF_MEMORY;  // the host ran out of mappings (vm.max_map_count)
    }
    units = pages(s, size) * static_cast<double>(count);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_access(unsigned long long* flags, const CUmemLocation* location,
                            CUdeviceptr ptr) {
  return run(EntryPoint::mem_get_access, true, [&](State& s, double&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (detail::bits(location->type) != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, location->id)) return CUDA_ERROR_INVALID_DEVICE;
    const auto va = static_cast<uintptr_t>(ptr);
    auto it = mapping_at(s, va);
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    auto run_it = it->second.access.upper_bound(va - it->first);
    --run_it;
    *flags = static_cast<unsigned long long>(run_it->second.flags_of(location->id));
    return CUDA_SUCCESS;
  });
}

// ---- streams and events -------------------------------------------------------------------------

CUresult sim_stream_create(CUstream* stream, unsigned int flags) {
  return run(EntryPoint::stream_create, true, [&](State& s, double&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (stream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto st = std::make_shared<Stream>();
    st->device = d;
    st->flags = flags;
    *stream = reinterpret_cast<CUstream>(st.get());
    s.streams.emplace(st.get(), std::move(st));
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_destroy(CUstream stream) {
  return run(EntryPoint::stream_destroy, true, [&](State& s, double&) {
    auto it = s.streams.find(reinterpret_cast<const Stream*>(stream));
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Returns at once; pending work still completes (the stream lives on in s.busy until then).
    it->second->destroyed = true;
    s.streams.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_synchronize(CUstream stream) {
  return run(EntryPoint::stream_synchronize, true, [&](State& s, double&) {
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    detail::force_complete(s, *st, st->last_seq());
    detail::progress(s);
    return CUDA_SUCCESS;
  });
}

CUresult sim_stream_query(CUstream stream) {
  return run(EntryPoint::stream_query, true, [&](State& s, double&) {
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    return st->pending.empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_stream_wait_event(CUstream stream, CUevent event, unsigned int flags) {
  return run(EntryPoint::stream_wait_event, true, [&](State& s, double&) {
    if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, -1, &st);
    if (r != CUDA_SUCCESS) return r;
    if (!e->complete() && e->stream.get() != st) enqueue(s, *st, {{e->stream, e->seq}});
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_create(CUevent* event, unsigned int flags) {
  return run(EntryPoint::event_create, true, [&](State& s, double&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (event == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto e = std::make_unique<Event>();
    e->device = d;
    e->flags = flags;
    *event = reinterpret_cast<CUevent>(e.get());
    s.events.emplace(e.get(), std::move(e));
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_destroy(CUevent event) {
  return run(EntryPoint::event_destroy, true, [&](State& s, double&) {
    auto it = s.events.find(reinterpret_cast<const Event*>(event));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    s.events.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_record(CUevent event, CUstream stream) {
  return run(EntryPoint::event_record, true, [&](State& s, double&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* st = nullptr;
    const CUresult r = stream_arg(s, stream, e->device, &st);
    if (r != CUDA_SUCCESS) return r;
    if (st->device != e->device) return CUDA_ERROR_INVALID_HANDLE;  // different contexts
    const uint64_t seq = enqueue(s, *st, {});
    e->stream = st->shared_from_this();
    e->seq = seq;
    return CUDA_SUCCESS;
  });
}

CUresult sim_event_query(CUevent event) {
  return run(EntryPoint::event_query, true, [&](State& s, double&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return e->complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult sim_event_synchronize(CUevent event) {
  return run(EntryPoint::event_synchronize, true, [&](State& s, double&) {
    Event* e = event_arg(s, event);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (e->stream) {
      detail::force_complete(s, *e->stream, e->seq);
      detail::progress(s);
    }
    return CUDA_SUCCESS;
  });
}

// ---- the table ----------------------------------------------------------------------------------

const driver::DriverTable& table() {
  static const driver::DriverTable t = [] {
    driver::DriverTable d;
    d.get_error_name = &sim_get_error_name;
    d.get_error_string = &sim_get_error_string;
    d.init = &sim_init;
    d.driver_get_version = &sim_driver_get_version;
    d.device_get = &sim_device_get;
    d.device_get_count = &sim_device_get_count;
    d.device_get_attribute = &sim_device_get_attribute;
    d.device_get_name = &sim_device_get_name;
    d.device_total_mem = &sim_device_total_mem;
    d.device_primary_ctx_retain = &sim_device_primary_ctx_retain;
    d.device_primary_ctx_release = &sim_device_primary_ctx_release;
    d.ctx_get_current = &sim_ctx_get_current;
    d.ctx_set_current = &sim_ctx_set_current;
    d.ctx_push_current = &sim_ctx_push_current;
    d.ctx_pop_current = &sim_ctx_pop_current;
    d.ctx_synchronize = &sim_ctx_synchronize;
    d.mem_get_info = &sim_mem_get_info;
    d.mem_address_reserve = &sim_mem_address_reserve;
    d.mem_address_free = &sim_mem_address_free;
    d.mem_create = &sim_mem_create;
    d.mem_release = &sim_mem_release;
    d.mem_map = &sim_mem_map;
    d.mem_unmap = &sim_mem_unmap;
    d.mem_set_access = &sim_mem_set_access;
    d.mem_get_access = &sim_mem_get_access;
    d.mem_get_allocation_granularity = &sim_mem_get_allocation_granularity;
    d.mem_get_allocation_properties_from_handle = &sim_mem_get_allocation_properties_from_handle;
    d.mem_retain_allocation_handle = &sim_mem_retain_allocation_handle;
    d.stream_create = &sim_stream_create;
    d.stream_destroy = &sim_stream_destroy;
    d.stream_synchronize = &sim_stream_synchronize;
    d.stream_query = &sim_stream_query;
    d.stream_wait_event = &sim_stream_wait_event;
    d.event_create = &sim_event_create;
    d.event_destroy = &sim_event_destroy;
    d.event_record = &sim_event_record;
    d.event_query = &sim_event_query;
    d.event_synchronize = &sim_event_synchronize;
    return d;
  }();
  return t;
}

}  // namespace expanse::sim
