#include "core/host/host_registered.hpp"

#include "core/base/format.hpp"
#include "core/host/context_scope.hpp"
#include "expanse/errors.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace expanse::core {

RegisteredHost::RegisteredHost(const driver::DriverTable& t, int node, CUcontext ctx, size_t limit)
    : t_(t), node_(node), ctx_(ctx), limit_(limit),
      page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))), order_(t) {
  stats_.page_bytes = page_;
  stats_.path = HostPath::registered;
}

RegisteredHost::~RegisteredHost() {
  ContextScope in(t_, ctx_);
  order_.poll(true, [&](uintptr_t at, size_t extent) { give_back(at, extent); });
  for (const auto& [at, b] : blocks_) give_back(at, b.extent);
}

void RegisteredHost::give_back(uintptr_t at, size_t extent) noexcept {
  void* p = reinterpret_cast<void*>(at);
  // A range the driver still has registered stays mapped (unused): unmapped, its address could
  // come back from mmap and fail the next register.
  if (t_.mem_host_unregister(p) == CUDA_SUCCESS) {
    ++stats_.num_released_pages;
    munmap(p, extent);
  }
  pinned_ -= extent;
  pending_extent_.erase(at);
}

void* RegisteredHost::allocate(size_t size, CUstream /*stream*/, int /*device*/) {
  if (size == 0) {
    throw usage_error("expanse: host allocation of 0 bytes on NUMA node " +
                      std::to_string(node_) + "; nothing was changed");
  }
  const CUcontext caller = current_or(t_, ctx_);
  ContextScope in(t_, ctx_);
  const bool polls = may_poll();
  if (polls) order_.poll(false, [&](uintptr_t at, size_t extent) { give_back(at, extent); });
  if (size > SIZE_MAX - page_) {
    ++stats_.num_ooms;
    throw out_of_memory("expanse: host allocation of " + std::to_string(size) + " bytes", size, -1);
  }
  const size_t extent = (size + page_ - 1) / page_ * page_;
  if (polls && order_.context_pending_bytes() >= extent) {
    // As much as this request waits for a context's streams (freed by deleters that name
    // none): a synchronize proves it and unpins it, rather than pinning more beside it.
    if (order_.sync_contexts() != 0) {
      ++stats_.num_waits;
      order_.poll(false, [&](uintptr_t at, size_t e) { give_back(at, e); });
    }
  }
  if (limit_ != SIZE_MAX && pinned_ + extent > limit_ && order_.pending() != 0 && polls) {
    ++stats_.num_waits;
    order_.poll(true, [&](uintptr_t at, size_t e) { give_back(at, e); });
  }
  if (limit_ != SIZE_MAX && pinned_ + extent > limit_) {
    ++stats_.num_ooms;
    throw out_of_memory("expanse: host allocation of " + std::to_string(size) +
                            " bytes on NUMA node " + std::to_string(node_) + ": " +
                            std::to_string(pinned_) + " bytes are pinned of a host_limit of " +
                            std::to_string(limit_) + " (cuMemHostRegister fallback)",
                        size, -1);
  }
  void* p = mmap(nullptr, extent, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    ++stats_.num_ooms;
    throw out_of_memory("expanse: host allocation of " + std::to_string(size) +
                            " bytes: mmap failed (the host is out of memory)",
                        size, -1);
  }
  const CUresult r = t_.mem_host_register(
      p, extent, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    munmap(p, extent);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      ++stats_.num_ooms;
      throw out_of_memory("expanse: host allocation of " + std::to_string(size) +
                              " bytes: cuMemHostRegister could not pin it (" + code_name(r) + ")",
                          size, -1);
    }
    throw driver_failure("expanse: host allocation of " + std::to_string(size) +
                             " bytes: cuMemHostRegister failed (" + code_name(r) +
                             "); nothing was changed",
                         static_cast<int>(r));
  }
  try {
    blocks_.emplace(reinterpret_cast<uintptr_t>(p), Block{size, extent, BlockUsers{{}, false, caller}});
  } catch (...) {
    t_.mem_host_unregister(p);
    munmap(p, extent);
    throw;
  }
  ++stats_.num_created_pages;
  pinned_ += extent;
  stats_.peak_pinned_bytes = std::max<uint64_t>(stats_.peak_pinned_bytes, pinned_);
  stats_.requested_bytes += size;
  stats_.allocated_bytes += extent;
  ++stats_.live_blocks;
  ++stats_.num_allocs;
  return p;
}

std::string RegisteredHost::describe(uintptr_t a) const {
  auto it = blocks_.upper_bound(a);
  if (it != blocks_.begin()) {
    --it;
    if (a > it->first && a < it->first + it->second.size) {
      return "an interior pointer, " + std::to_string(a - it->first) +
             " bytes into the host block at " + hex(it->first);
    }
  }
  if (pending_extent_.count(a) != 0) return "freed already (its stream's work may still be running)";
  return "not memory expanse_host_malloc returned (freed already, or never one)";
}

void RegisteredHost::free(void* p, CUstream stream) {
  // A NULL stream is the calling thread's context's (the pool's where it has none).
  const CUcontext caller = current_or(t_, nullptr);
  retire(p, {{stream, caller == nullptr ? ctx_ : caller}}, nullptr, false);
  ContextScope in(t_, caller == nullptr ? ctx_ : nullptr);  // unregistering needs a context
  if (may_poll()) order_.poll(false, [&](uintptr_t at, size_t extent) { give_back(at, extent); });
}

void RegisteredHost::free_after_context(void* p, CUcontext ctx, bool every_stream) {
  retire(p, {}, ctx, every_stream);
}

void RegisteredHost::retire(void* p, std::vector<NamedStream> streams, CUcontext after,
                    bool every_stream) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.find(a);
  if (it == blocks_.end()) {
    throw usage_error("expanse: host free of " + hex(a) + ": " + describe(a) +
                      "; nothing was changed");
  }
  pending_extent_.emplace(a, it->second.extent);
  try {
    order_.add_free(a, it->second.extent, it->second.users, std::move(streams), after,
                    every_stream);
  } catch (...) {
    pending_extent_.erase(a);
    throw;
  }
  stats_.requested_bytes -= it->second.size;
  stats_.allocated_bytes -= it->second.extent;
  --stats_.live_blocks;
  ++stats_.num_frees;
  blocks_.erase(it);
}

void RegisteredHost::record_stream(void* p, CUstream stream) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.find(a);
  if (it == blocks_.end()) {
    throw usage_error("expanse: host record_stream of " + hex(a) + ": " + describe(a) +
                      "; nothing was changed");
  }
  it->second.users.name(t_, stream);
}

void RegisteredHost::release_cached() {
  ContextScope in(t_, ctx_);
  if (!may_poll()) return;
  if (order_.context_pending_bytes() != 0) order_.sync_contexts();
  order_.poll(false, [&](uintptr_t at, size_t extent) { give_back(at, extent); });
}

void RegisteredHost::reset_peak() { stats_.peak_pinned_bytes = pinned_; }

HostPoolStats RegisteredHost::stats() const {
  HostPoolStats s = stats_;
  s.pinned_bytes = pinned_;
  s.mapped_bytes = pinned_;
  s.limit_bytes = limit_ == SIZE_MAX ? UINT64_MAX : limit_;
  s.pending_blocks = order_.pending();
  return s;
}

bool RegisteredHost::block_of(const void* p, void** base, size_t* size) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it == blocks_.begin()) return false;
  --it;
  if (a >= it->first + it->second.size) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second.size;
  return true;
}

bool RegisteredHost::contains(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it != blocks_.begin() && a < std::prev(it)->first + std::prev(it)->second.extent) return true;
  auto pe = pending_extent_.upper_bound(a);
  return pe != pending_extent_.begin() && a < std::prev(pe)->first + std::prev(pe)->second;
}

}  // namespace expanse::core
