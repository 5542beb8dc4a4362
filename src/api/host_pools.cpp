#include "api/host_pools.hpp"

#include "api/runtime.hpp"
#include "core/base/format.hpp"
#include "core/host/host_pool.hpp"
#include "core/host/host_registered.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <string>

namespace expanse::api {
namespace {

// The address space a node's pool reserves: room to place any request the limit allows twice
// over, and at least 256 GiB (VA costs nothing until mapped).
size_t va_for(size_t limit) {
  const size_t floor = size_t{256} << 30;
  return limit == SIZE_MAX ? floor : std::max(floor, limit / 2 >= (SIZE_MAX >> 2) ? floor : 2 * limit);
}

}  // namespace

int HostPools::device_of(CUstream stream) const {
  const driver::DriverTable& t = rt_.driver().table();
  CUcontext ctx = nullptr;
  if (t.stream_get_ctx(stream, &ctx) != CUDA_SUCCESS || ctx == nullptr) return 0;
  if (t.ctx_push_current(ctx) != CUDA_SUCCESS) return 0;
  CUdevice dev = 0;
  const CUresult r = t.ctx_get_device(&dev);
  CUcontext popped = nullptr;
  t.ctx_pop_current(&popped);
  if (r != CUDA_SUCCESS) return 0;
  for (int d = 0; d < rt_.device_count(); ++d) {
    CUdevice h = 0;
    if (t.device_get(&h, d) == CUDA_SUCCESS && h == dev) return d;
  }
  return 0;
}

bool HostPools::probe_vmm(int node, int device, bool named) const {
  const driver::DriverTable& t = rt_.driver().table();
  CUdevice dev = 0;
  int vmm = 0;
  if (t.device_get(&dev, device) != CUDA_SUCCESS ||
      t.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             dev) != CUDA_SUCCESS ||
      vmm == 0) {
    return false;  // an older driver or GPU
  }
  // The attribute can say yes where the process may not pin through VMM (a container without
  // the capability NCCL documents): one page made and released says.
  const CUmemAllocationProp prop = core::host_prop(node);
  size_t page = 0;
  if (t.mem_get_allocation_granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
      CUDA_SUCCESS) {
    return false;
  }
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = t.mem_create(&h, page, &prop, 0);
  if (r == CUDA_ERROR_INVALID_VALUE && named) {
    throw usage_error("expanse_host_malloc: NUMA node " + std::to_string(node) +
                      ": the driver refuses it (" + core::code_name(r) + "); nothing was changed");
  }
  // Any other refusal (a node the driver will not use, a container without the capability, no
  // memory to pin a page) falls back, as NCCL's host allocation does.
  if (r != CUDA_SUCCESS) return false;
  t.mem_release(h);
  return true;
}

core::HostMemory& HostPools::pool_locked(int node, int device, bool named) {
  auto it = pools_.find(node);
  if (it != pools_.end()) return *it->second;
  // The device's primary context: the pool's driver calls and events run there.
  const CUcontext ctx = rt_.device(device).driver().primary();
  const driver::DriverTable& t = rt_.driver().table();
  bool vmm = false;
  {
    CUcontext popped = nullptr;
    const bool pushed = t.ctx_push_current(ctx) == CUDA_SUCCESS;
    try {
      vmm = probe_vmm(node, device, named);
    } catch (...) {
      if (pushed) t.ctx_pop_current(&popped);
      throw;
    }
    if (pushed) t.ctx_pop_current(&popped);
  }
  std::unique_ptr<core::HostMemory> pool;
  if (vmm) {
    pool = std::make_unique<core::HostPool>(t, node, ctx, device, rt_.device_count(), limit_,
                                            va_for(limit_));
  } else {
    pool = std::make_unique<core::RegisteredHost>(t, node, ctx, limit_);
  }
  // No event of the free order is queried while the application announces a graph capture in
  // any device's context (expanse_capture_begin, pools' capture routes).
  pool->set_may_poll([this] {
    for (int d = 0; d < rt_.device_count(); ++d) {
      const core::DeviceAllocator* a = rt_.existing(d);
      if (a != nullptr && core::CaptureAnnouncements::count(a->driver().primary()) != 0) {
        return false;
      }
    }
    return true;
  });
  return *pools_.emplace(node, std::move(pool)).first->second;
}

core::HostMemory* HostPools::owner_locked(const void* p) {
  for (auto& [node, pool] : pools_) {
    if (pool->contains(p)) return pool.get();
  }
  return nullptr;
}

void HostPools::refuse(const void* p, const char* what) const {
  // Not host memory of expanse's: say what it is when it is a device block.
  for (int d = 0; d < rt_.device_count(); ++d) {
    core::DeviceAllocator* a = rt_.existing(d);
    size_t size = 0;
    if (a != nullptr && a->owns(p, &size)) {
      throw usage_error(std::string("expanse: ") + what + " of " +
                        core::hex(reinterpret_cast<uintptr_t>(p)) + ": a device block of device " +
                        std::to_string(d) + " (" + std::to_string(size) +
                        " bytes), not pinned host memory: use expanse_free; nothing was changed");
    }
  }
  throw usage_error(std::string("expanse: ") + what + " of " +
                    core::hex(reinterpret_cast<uintptr_t>(p)) +
                    ": not memory expanse_host_malloc returned; nothing was changed");
}

void* HostPools::allocate(size_t size, int node, CUstream stream) {
  if (node < -1) {
    throw usage_error("expanse_host_malloc: NUMA node " + std::to_string(node) +
                      " (a node is 0 or more, or -1 for the device's nearest); nothing was "
                      "changed");
  }
  const int device = device_of(stream);
  const bool named = node != -1;
  if (node == -1) {
    const driver::DriverTable& t = rt_.driver().table();
    CUdevice dev = 0;
    int near = -1;
    if (t.device_get(&dev, device) == CUDA_SUCCESS) {
      t.device_get_attribute(&near, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
    }
    node = near < 0 ? 0 : near;
  }
  std::lock_guard<std::mutex> lock(mu_);
  core::HostMemory& pool = pool_locked(node, device, named);
  try {
    return pool.allocate(size, stream, device);
  } catch (const usage_error&) {
    // The node refused: a pool that never held a page is not kept.
    if (pool.stats().pinned_bytes == 0 && pool.stats().live_blocks == 0) pools_.erase(node);
    throw;
  }
}

void HostPools::free(void* p, CUstream stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_not_staged_locked(p, "expanse_host_free");
    if (core::HostMemory* pool = owner_locked(p)) return pool->free(p, stream);
  }
  refuse(p, "expanse_host_free");
}

void HostPools::check_device(int device, const void* p, const char* what) const {
  if (device >= -1 && device < rt_.device_count()) return;
  throw usage_error(std::string("expanse: ") + what + " of " +
                    core::hex(reinterpret_cast<uintptr_t>(p)) + ": device " +
                    std::to_string(device) + " (0 to " + std::to_string(rt_.device_count() - 1) +
                    ", or -1 for the block's own); nothing was changed");
}

void HostPools::free_after_device(void* p, int device, bool every_stream) {
  check_device(device, p, "expanse_host_free_after_device");
  const CUcontext ctx = device >= 0 ? rt_.device(device).driver().primary() : nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_not_staged_locked(p, "expanse_host_free_after_device");
    if (core::HostMemory* pool = owner_locked(p)) return pool->free_after_context(p, ctx, every_stream);
  }
  refuse(p, "expanse_host_free_after_device");
}

void HostPools::record_stream(void* p, CUstream stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_not_staged_locked(p, "expanse_host_record_stream");
    if (core::HostMemory* pool = owner_locked(p)) return pool->record_stream(p, stream);
  }
  refuse(p, "expanse_host_record_stream");
}

void HostPools::check_not_staged_locked(const void* p, const char* what) const {
  // A stale pointer (freed, and its memory since given to a sleeping pool's staging) must not
  // free or touch the bytes a wake will copy back.
  auto it = staged_.upper_bound(const_cast<void*>(p));
  if (it == staged_.begin()) return;
  --it;
  const auto base = reinterpret_cast<uintptr_t>(it->first);
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a >= base && a < base + it->second.second) {
    throw usage_error(std::string("expanse: ") + what + " of " + core::hex(a) +
                      ": expanse's own staging of a sleeping pool's bytes now (the pointer was "
                      "freed already, and its memory reused); nothing was changed");
  }
}

void* HostPools::stage(size_t bytes, int device) noexcept {
  try {
    const driver::DriverTable& t = rt_.driver().table();
    CUdevice dev = 0;
    int node = -1;
    if (t.device_get(&dev, device) == CUDA_SUCCESS) {
      t.device_get_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
    }
    std::lock_guard<std::mutex> lock(mu_);
    node = node < 0 ? 0 : node;
    void* p = pool_locked(node, device, false).allocate(bytes, nullptr, device);
    try {
      staged_.emplace(p, std::make_pair(node, bytes));
    } catch (...) {
      pools_.at(node)->free(p, nullptr);
      throw;
    }
    return p;
  } catch (...) {
    return nullptr;  // the allocator pins its own
  }
}

bool HostPools::unstage(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  core::HostMemory* pool = owner_locked(p);
  if (pool == nullptr) return false;
  try {
    pool->free(p, nullptr);
    staged_.erase(p);
  } catch (...) {
    // Kept live in its pool, still staging (given back with the pool): not the driver's to free.
  }
  return true;
}

void HostPools::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [node, pool] : pools_) pool->reset_peak();
}

void HostPools::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [node, pool] : pools_) pool->release_cached();
}

void HostPools::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
  for (auto& [node, pool] : pools_) pool->set_limit(bytes);
}

core::HostPoolStats HostPools::stats(int node) {
  std::lock_guard<std::mutex> lock(mu_);
  core::HostPoolStats sum;
  sum.limit_bytes = limit_ == SIZE_MAX ? UINT64_MAX : limit_;
  auto unstaged = [&](int n, core::HostPoolStats s) {
    for (const auto& [p, where] : staged_) {
      if (where.first != n) continue;
      --s.live_blocks;
      s.requested_bytes -= where.second;
    }
    return s;
  };
  if (node >= 0) {
    auto it = pools_.find(node);
    return it != pools_.end() ? unstaged(node, it->second->stats()) : sum;
  }
  for (auto& [n, pool] : pools_) {
    const core::HostPoolStats s = unstaged(n, pool->stats());
    if (sum.page_bytes == 0) {
      sum.page_bytes = s.page_bytes;
      sum.path = s.path;
    }
    sum.requested_bytes += s.requested_bytes;
    sum.allocated_bytes += s.allocated_bytes;
    sum.pinned_bytes += s.pinned_bytes;
    sum.mapped_bytes += s.mapped_bytes;
    sum.peak_pinned_bytes += s.peak_pinned_bytes;
    sum.live_blocks += s.live_blocks;
    sum.pending_blocks += s.pending_blocks;
    sum.num_allocs += s.num_allocs;
    sum.num_frees += s.num_frees;
    sum.num_created_pages += s.num_created_pages;
    sum.num_released_pages += s.num_released_pages;
    sum.num_remapped_pages += s.num_remapped_pages;
    sum.num_waits += s.num_waits;
    sum.num_ooms += s.num_ooms;
  }
  return sum;
}

bool HostPools::block_of(const void* p, void** base, size_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  core::HostMemory* pool = owner_locked(p);
  if (pool == nullptr || !pool->block_of(p, base, size)) return false;
  return staged_.count(*base) == 0;
}

size_t HostPools::live_size(const void* p, const char* what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_not_staged_locked(p, what);
    if (core::HostMemory* pool = owner_locked(p)) {
      void* base = nullptr;
      size_t n = 0;
      if (pool->block_of(p, &base, &n) && base == p) return n;
      throw usage_error(std::string("expanse: ") + what + " of " +
                        core::hex(reinterpret_cast<uintptr_t>(p)) +
                        ": pinned host memory, but not the start of a live block (an interior "
                        "pointer, or freed); nothing was changed");
    }
  }
  refuse(p, what);
}

bool HostPools::any_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t live = 0;
  for (const auto& [node, pool] : pools_) live += pool->stats().live_blocks;
  return live > staged_.size();
}

}  // namespace expanse::api
