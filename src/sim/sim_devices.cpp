// The sim's entry points for errors, cuInit, devices, contexts and cuMemGetInfo.
//
// Every entry point runs through detail::run (sim_call.hpp): under the global lock it counts the
// call, fires an injected failure if one is due (no side effects), checks cuInit, runs its body
// and, on success, adds its modeled cost. Misuse is answered with the code the CUDA Driver API
// documents for it (or a real driver was seen to answer), before any state changes.
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"
#include "driver_api/error_names.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

namespace expanse::sim {
namespace {

// ---- device attributes --------------------------------------------------------------------------

// An A100-80GB-like device (compute capability 8.0) that supports VMM and nothing else that needs
// hardware: no compression, no multicast. POSIX file-descriptor handles (103), RDMA with VMM
// (110), host NUMA VMM (141) and the host NUMA node (134) follow sim_posix_fd, sim_rdma and
// sim_host_numa (the caller fills them in).
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

// The device of ctx (NULL: the calling thread's current context), or -1 when there is none or
// its primary context is not retained.
int context_device(State& s, CUcontext ctx) {
  if (ctx == nullptr) return detail::current_device(s);
  const Context* c = detail::find_context(s, ctx);
  return c != nullptr && device(s, c->device).primary_refs > 0 ? c->device : -1;
}

}  // namespace

namespace detail {

namespace {
std::atomic<pid_t> g_pid{0};
void note_fork_child() noexcept { g_pid.store(getpid()); }
}  // namespace

pid_t this_process() noexcept {
  static const bool registered = [] {
    g_pid.store(getpid());
    pthread_atfork(nullptr, nullptr, note_fork_child);
    return true;
  }();
  (void)registered;
  return g_pid.load(std::memory_order_relaxed);
}

}  // namespace detail

// ---- errors, init, version ----------------------------------------------------------------------

CUresult sim_get_error_name(CUresult error, const char** str) {
  return run(EntryPoint::get_error_name, false, [&](State&, CallSize&) {
    if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *str = driver::error_name(detail::bits(error));
    return *str == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  });
}

CUresult sim_get_error_string(CUresult error, const char** str) {
  return run(EntryPoint::get_error_string, false, [&](State&, CallSize&) {
    if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *str = driver::error_string(detail::bits(error));
    return *str == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  });
}

CUresult sim_init(unsigned int flags) {
  return run(EntryPoint::init, false, [&](State& s, CallSize&) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (s.devices.empty()) return CUDA_ERROR_NO_DEVICE;
    // Initialized by the parent of a fork: this child may not use the driver (run()).
    if (s.initialized && !detail::initialized_here(s)) return CUDA_ERROR_NOT_INITIALIZED;
    s.initialized = true;
    s.init_pid = detail::this_process();
    return CUDA_SUCCESS;
  });
}

CUresult sim_driver_get_version(int* version) {
  return run(EntryPoint::driver_get_version, false, [&](State& s, CallSize&) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = s.cfg.driver_version;
    return CUDA_SUCCESS;
  });
}

// ---- devices ------------------------------------------------------------------------------------

CUresult sim_device_get(CUdevice* dev, int ordinal) {
  return run(EntryPoint::device_get, true, [&](State& s, CallSize&) {
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = detail::device_handle(ordinal);
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_count(int* count) {
  return run(EntryPoint::device_get_count, true, [&](State& s, CallSize&) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(s.devices.size());
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_attribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  return run(EntryPoint::device_get_attribute, true, [&](State& s, CallSize&) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int o = detail::device_ordinal(s, dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    const int a = detail::bits(attrib);
    if (a <= 0 || a >= static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX)) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    if (!device_attribute(a, &v)) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) v = o + 1;
    if (a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
      v = s.cfg.posix_fd ? 1 : 0;
    if (a == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) v = s.cfg.rdma ? 1 : 0;
    if (a == CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
      v = s.cfg.host_numa ? 1 : 0;
    }
    if (a == CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID) v = s.cfg.host_numa ? 0 : -1;
    *value = v;
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_get_name(char* name, int len, CUdevice dev) {
  return run(EntryPoint::device_get_name, true, [&](State& s, CallSize&) {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    const int o = detail::device_ordinal(s, dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "expanse sim device %d", o);
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_total_mem(size_t* bytes, CUdevice dev) {
  return run(EntryPoint::device_total_mem, true, [&](State& s, CallSize&) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (detail::device_ordinal(s, dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = s.cfg.capacity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_total_mem_v1(unsigned int* bytes, CUdevice dev) {
  return run(EntryPoint::device_total_mem, true, [&](State& s, CallSize&) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (detail::device_ordinal(s, dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = static_cast<unsigned int>(std::min<size_t>(s.cfg.capacity, UINT_MAX));
    return CUDA_SUCCESS;
  });
}

// ---- contexts -----------------------------------------------------------------------------------

CUresult sim_device_primary_ctx_retain(CUcontext* ctx, CUdevice dev) {
  return run(EntryPoint::device_primary_ctx_retain, true, [&](State& s, CallSize&) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int o = detail::device_ordinal(s, dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    Device& d = device(s, o);
    ++d.primary_refs;
    *ctx = reinterpret_cast<CUcontext>(&d.ctx);
    return CUDA_SUCCESS;
  });
}

CUresult sim_device_primary_ctx_release(CUdevice dev) {
  return run(EntryPoint::device_primary_ctx_release, true, [&](State& s, CallSize&) {
    const int o = detail::device_ordinal(s, dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    Device& d = device(s, o);
    if (d.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--d.primary_refs == 0) detail::reset_device_context(s, o);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_get_current(CUcontext* ctx) {
  return run(EntryPoint::ctx_get_current, true, [&](State& s, CallSize&) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& stack = detail::context_stack(s);
    *ctx = stack.empty() ? nullptr : reinterpret_cast<CUcontext>(stack.back());
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_set_current(CUcontext ctx) {
  return run(EntryPoint::ctx_set_current, true, [&](State& s, CallSize&) {
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
  return run(EntryPoint::ctx_push_current, true, [&](State& s, CallSize&) {
    Context* c = detail::find_context(s, ctx);
    if (c == nullptr || device(s, c->device).primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!detail::context_stack(s).push_back(c)) return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_pop_current(CUcontext* ctx) {
  return run(EntryPoint::ctx_pop_current, true, [&](State& s, CallSize&) {
    auto& stack = detail::context_stack(s);
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    Context* c = stack.back();
    stack.pop_back();
    if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(c);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_synchronize() { return sim_ctx_synchronize_v2(nullptr); }

CUresult sim_ctx_synchronize_v2(CUcontext ctx) {
  return run(EntryPoint::ctx_synchronize, true, [&](State& s, CallSize&) {
    const int d = context_device(s, ctx);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult c = detail::context_sync_check(s, d); c != CUDA_SUCCESS) return c;
    detail::complete_device(s, d);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  return run(EntryPoint::mem_get_info, true, [&](State& s, CallSize&) {
    const int d = detail::current_device(s);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (free_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = s.cfg.capacity - device(s, d).physical_used;
    if (total_bytes != nullptr) *total_bytes = s.cfg.capacity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_info_v1(unsigned int* free_bytes, unsigned int* total_bytes) {
  return run(EntryPoint::mem_get_info, true, [&](State& s, CallSize&) {
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

}  // namespace expanse::sim

namespace expanse::sim {

// ---- device handles -----------------------------------------------------------------------------

// CUdevice values are not the ordinals (the driver promises nothing else; on today's GPUs they
// happen to coincide), so that code mixing the two fails in the sim, not first on a GPU.
constexpr CUdevice kDeviceHandleBase = 0x100;

CUdevice detail::device_handle(int ordinal) noexcept { return kDeviceHandleBase + ordinal; }

int detail::device_ordinal(const State& s, CUdevice dev) noexcept {
  const int o = dev - kDeviceHandleBase;
  return valid_device(s, o) ? o : -1;
}

// ---- peers and context queries ------------------------------------------------------------------

CUresult sim_device_can_access_peer(int* can, CUdevice dev, CUdevice peer) {
  return run(EntryPoint::device_can_access_peer, true, [&](State& s, CallSize&) {
    if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int d = detail::device_ordinal(s, dev);
    const int p = detail::device_ordinal(s, peer);
    if (d < 0 || p < 0) return CUDA_ERROR_INVALID_DEVICE;
    // A device is not its own peer (the driver answers 0 for dev == peer).
    *can = d != p && s.cfg.peer_access ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_get_device(CUdevice* dev) { return sim_ctx_get_device_v2(dev, nullptr); }

CUresult sim_ctx_get_device_v2(CUdevice* dev, CUcontext ctx) {
  return run(EntryPoint::ctx_get_device, true, [&](State& s, CallSize&) {
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int d = context_device(s, ctx);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = detail::device_handle(d);
    return CUDA_SUCCESS;
  });
}

CUresult sim_ctx_get_id(CUcontext ctx, unsigned long long* id) {
  return run(EntryPoint::ctx_get_id, true, [&](State& s, CallSize&) {
    if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (ctx == nullptr) {
      const int d = detail::current_device(s);
      if (d >= 0) c = &device(s, d).ctx;
    } else {
      c = detail::find_context(s, ctx);
      if (c != nullptr && device(s, c->device).primary_refs == 0) c = nullptr;
    }
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *id = c->id;
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
