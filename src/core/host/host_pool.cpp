#include "core/host/host_pool.hpp"

#include "core/base/check.hpp"
#include "core/base/format.hpp"
#include "core/host/context_scope.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <utility>

namespace expanse::core {
namespace {

constexpr size_t kSmallAlign = 512;

}  // namespace

CUmemAllocationProp host_prop(int node) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = node;
  return p;
}

HostPool::HostPool(const driver::DriverTable& t, int node, CUcontext ctx, int owner, int devices,
                   size_t limit, size_t va_bytes)
    : t_(t), node_(node), ctx_(ctx), owner_(owner), limit_(limit), order_(t) {
  for (int d = 0; d < devices; ++d) devices_.insert(d);
  devices_.insert(owner_);
  ContextScope current(t_, ctx_);
  const CUmemAllocationProp prop = host_prop(node_);
  check(t_.mem_get_allocation_granularity(&page_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  va_bytes_ = (va_bytes + page_ - 1) / page_ * page_;
  CUdeviceptr base = 0;
  check(t_.mem_address_reserve(&base, va_bytes_, page_, 0, 0), "cuMemAddressReserve");
  base_ = static_cast<uintptr_t>(base);
  pages_.assign(va_bytes_ / page_, 0);
  users_.assign(va_bytes_ / page_, 0);
  free_ranges_.emplace(0, va_bytes_);
  stats_.page_bytes = page_;
}

HostPool::~HostPool() {
  ContextScope current(t_, ctx_);
  // Copies still running from freed blocks finish before their pages go (cuMemUnmap does not
  // wait for the GPU).
  poll_pending(true);
  for (size_t i = 0; i < pages_.size(); ++i) {
    if (pages_[i] == 0) continue;
    t_.mem_unmap(static_cast<CUdeviceptr>(base_ + i * page_), page_);
    t_.mem_release(pages_[i]);
  }
  for (CUmemGenericAllocationHandle h : unmapped_) t_.mem_release(h);
  if (base_ != 0) t_.mem_address_free(static_cast<CUdeviceptr>(base_), va_bytes_);
}

void HostPool::check(CUresult r, const char* call) const {
  if (r == CUDA_SUCCESS) return;
  throw driver_failure("expanse: host pool of NUMA node " + std::to_string(node_) + ": " + call +
                           " failed (" + code_name(r) + ")",
                       static_cast<int>(r));
}

// ---- VA ------------------------------------------------------------------------------------

bool HostPool::take_range(size_t extent, bool page_aligned, size_t* offset) {
  // Best fit: the smallest free range that holds the block (from a page boundary for a large
  // one), so small blocks pack into the gaps large ones leave.
  auto best = free_ranges_.end();
  size_t best_at = 0;
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    const size_t at = page_aligned ? (it->first + page_ - 1) / page_ * page_ : it->first;
    if (at - it->first + extent > it->second) continue;
    if (best == free_ranges_.end() || it->second < best->second) {
      best = it;
      best_at = at;
    }
  }
  if (best == free_ranges_.end()) return false;
  const size_t start = best->first;
  const size_t size = best->second;
  free_ranges_.erase(best);
  if (best_at > start) free_ranges_.emplace(start, best_at - start);
  if (best_at + extent < start + size) {
    free_ranges_.emplace(best_at + extent, start + size - best_at - extent);
  }
  *offset = best_at;
  return true;
}

void HostPool::give_range(size_t offset, size_t extent) {
  auto next = free_ranges_.lower_bound(offset);
  if (next != free_ranges_.end() && next->first == offset + extent) {
    extent += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += extent;
      return;
    }
  }
  free_ranges_.emplace(offset, extent);
}

// ---- pages ---------------------------------------------------------------------------------

void HostPool::touch(size_t first, size_t last) {
  for (size_t i = first; i <= last; ++i) ++users_[i];
}

void HostPool::untouch(size_t first, size_t last) {
  for (size_t i = first; i <= last; ++i) {
    EXPANSE_ASSERT(users_[i] > 0);
    --users_[i];
  }
}

void HostPool::grant(uintptr_t va, size_t bytes) {
  std::vector<CUmemAccessDesc> desc(1 + devices_.size());
  desc[0].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  desc[0].location.id = node_;
  desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t k = 1;
  for (int d : devices_) {
    desc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[k].location.id = d;
    desc[k].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ++k;
  }
  const CUresult r =
      t_.mem_set_access(static_cast<CUdeviceptr>(va), bytes, desc.data(), desc.size());
  if (r == CUDA_SUCCESS || devices_.size() <= 1) {
    check(r, "cuMemSetAccess");
    return;
  }
  // A device the driver will not give access to (no path to this node's memory) must not fail
  // every request: the host and the first device, alone, are granted; the others are dropped.
  devices_ = {owner_};
  grant(va, bytes);
}

void HostPool::add_device(int device) {
  if (device < 0 || devices_.count(device) != 0) return;
  devices_.insert(device);
  try {
    // Every mapped page, run by run of adjacent mappings.
    for (size_t i = 0; i < pages_.size();) {
      if (pages_[i] == 0) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < pages_.size() && pages_[j] != 0) ++j;
      grant(base_ + i * page_, (j - i) * page_);
      i = j;
    }
  } catch (...) {
    devices_.erase(device);
    throw;
  }
}

void HostPool::map_page(size_t i, CUmemGenericAllocationHandle h) {
  const auto va = static_cast<CUdeviceptr>(base_ + i * page_);
  const CUresult r = t_.mem_map(va, page_, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    unmapped_.push_back(h);
    check(r, "cuMemMap");
  }
  try {
    grant(base_ + i * page_, page_);
  } catch (...) {
    if (t_.mem_unmap(va, page_) == CUDA_SUCCESS) {
      unmapped_.push_back(h);
    } else {  // mapped without access: kept as the page's, granted again before it is used
      pages_[i] = h;
      ++mapped_pages_;
      ungranted_.insert(i);
    }
    throw;
  }
  pages_[i] = h;
  ++mapped_pages_;
}

CUmemGenericAllocationHandle HostPool::page_handle(size_t first, size_t last) {
  if (!unmapped_.empty()) {
    const CUmemGenericAllocationHandle h = unmapped_.back();
    unmapped_.pop_back();
    return h;
  }
  const size_t held = mapped_pages_ + unmapped_.size();
  if (limit_ == SIZE_MAX || (held + 1) * page_ <= limit_) {
    const CUmemAllocationProp prop = host_prop(node_);
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = t_.mem_create(&h, page_, &prop, 0);
    if (r == CUDA_SUCCESS) {
      ++stats_.num_created_pages;
      return h;
    }
    if (r == CUDA_ERROR_INVALID_VALUE) {
      throw usage_error("expanse: host allocation on NUMA node " + std::to_string(node_) +
                        ": the driver refuses the node (cuMemCreate: " + code_name(r) +
                        "); nothing was changed");
    }
    if (r != CUDA_ERROR_OUT_OF_MEMORY) check(r, "cuMemCreate");
  }
  // A page under free memory elsewhere: unmapped there, mapped again here. The search goes on
  // from where the last one stopped, so a request moving many pages scans the range once.
  for (size_t step = 0; step < pages_.size(); ++step) {
    const size_t j = reclaim_from_;
    reclaim_from_ = reclaim_from_ + 1 == pages_.size() ? 0 : reclaim_from_ + 1;
    if (pages_[j] == 0 || users_[j] != 0 || (j >= first && j <= last)) continue;
    const CUresult r = t_.mem_unmap(static_cast<CUdeviceptr>(base_ + j * page_), page_);
    check(r, "cuMemUnmap");
    const CUmemGenericAllocationHandle h = pages_[j];
    pages_[j] = 0;
    --mapped_pages_;
    ungranted_.erase(j);
    ++stats_.num_remapped_pages;
    return h;
  }
  return 0;
}

size_t HostPool::pages_lacking(size_t first, size_t last) const {
  size_t n = 0;
  for (size_t i = first; i <= last; ++i) n += pages_[i] == 0 ? 1 : 0;
  return n;
}

bool HostPool::mapped(size_t first, size_t last) const {
  for (size_t i = first; i <= last; ++i) {
    if (pages_[i] == 0 || ungranted_.count(i) != 0) return false;
  }
  return true;
}

bool HostPool::back_pages(size_t first, size_t last, int /*device*/) {
  for (size_t i = first; i <= last; ++i) {
    if (pages_[i] != 0 && ungranted_.count(i) != 0) {
      grant(base_ + i * page_, page_);
      ungranted_.erase(i);
    }
    if (pages_[i] != 0) continue;
    const CUmemGenericAllocationHandle h = page_handle(first, last);
    if (h == 0) return false;
    map_page(i, h);
    note_peak();
  }
  return true;
}

void HostPool::reset_peak() {
  stats_.peak_pinned_bytes = (mapped_pages_ + unmapped_.size()) * page_;
}

void HostPool::note_peak() {
  const uint64_t held = (mapped_pages_ + unmapped_.size()) * page_;
  stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, held);
}

// ---- stream order --------------------------------------------------------------------------

bool HostPool::poll_pending(bool wait) {
  return order_.poll(wait, [&](uintptr_t at, size_t extent) {
           untouch((at - base_) / page_, (at - base_ + extent - 1) / page_);
           give_range(at - base_, extent);
         }) != 0;
}

// ---- the entry points ----------------------------------------------------------------------

void* HostPool::allocate(size_t size, CUstream /*stream*/, int device) {
  if (size == 0) {
    throw usage_error("expanse: host allocation of 0 bytes on NUMA node " +
                      std::to_string(node_) + "; nothing was changed");
  }
  if (size > va_bytes_) {
    ++stats_.num_ooms;
    throw out_of_memory("expanse: host allocation of " + std::to_string(size) +
                            " bytes on NUMA node " + std::to_string(node_) +
                            ": more than the pool's " + std::to_string(va_bytes_) +
                            " bytes of address space",
                        size, -1);
  }
  const CUcontext caller = current_or(t_, ctx_);
  ContextScope current(t_, ctx_);
  add_device(device);
  const bool polls = may_poll();
  if (polls) poll_pending(false);
  const bool large = size >= page_;
  const size_t extent =
      large ? (size + page_ - 1) / page_ * page_ : (size + kSmallAlign - 1) / kSmallAlign * kSmallAlign;
  bool synced = false;
  for (bool waited = false;;) {
    size_t offset = 0;
    if (take_range(extent, large, &offset)) {
      const size_t first = offset / page_;
      const size_t last = (offset + extent - 1) / page_;
      touch(first, last);
      if (polls && !synced && order_.context_pending_bytes() >= extent &&
          pages_lacking(first, last) > unmapped_.size()) {
        // New pages would be pinned while at least this much waits for a context's streams
        // (freed by deleters that name none): one synchronize proves it all, and the request is
        // placed again with that memory free.
        untouch(first, last);
        give_range(offset, extent);
        synced = true;
        if (order_.sync_contexts() != 0) {
          ++stats_.num_waits;
          poll_pending(false);
        }
        continue;
      }
      if (!polls && !mapped(first, last)) {
        // New mappings and their access grants are not allowed while a graph is captured (they
        // would invalidate a global-mode capture): only memory mapped already serves.
        untouch(first, last);
        give_range(offset, extent);
        ++stats_.num_ooms;
        throw usage_error("expanse: host allocation of " + std::to_string(size) +
                          " bytes on NUMA node " + std::to_string(node_) +
                          " during an announced graph capture needs pages mapped, which the "
                          "capture does not allow: allocate it before the capture begins; "
                          "nothing was changed");
      }
      bool backed = false;
      try {
        backed = back_pages(first, last, device);
      } catch (...) {
        untouch(first, last);
        give_range(offset, extent);
        throw;
      }
      if (backed) {
        blocks_.emplace(base_ + offset, Block{size, extent, BlockUsers{{}, false, caller}});
        stats_.requested_bytes += size;
        stats_.allocated_bytes += extent;
        ++stats_.live_blocks;
        ++stats_.num_allocs;
        return reinterpret_cast<void*>(base_ + offset);
      }
      untouch(first, last);  // its pages mapped so far stay, free: the next request's
      give_range(offset, extent);
    }
    if (waited || order_.pending() == 0 || !polls) break;
    ++stats_.num_waits;
    poll_pending(true);  // freed blocks whose copies are still running: wait for them
    waited = true;
  }
  ++stats_.num_ooms;
  const size_t held = (mapped_pages_ + unmapped_.size()) * page_;
  throw out_of_memory("expanse: host allocation of " + std::to_string(size) +
                          " bytes on NUMA node " + std::to_string(node_) + ": " +
                          std::to_string(stats_.allocated_bytes) + " bytes are live, " +
                          std::to_string(held) + " pinned" +
                          (limit_ == SIZE_MAX ? std::string(" (no limit)")
                                              : " of a limit of " + std::to_string(limit_)) +
                          ", and the driver has no more pages to pin",
                      size, -1);
}

void HostPool::free(void* p, CUstream stream) {
  // A NULL or per-thread stream is the calling thread's current context's (the copy that used the
  // block was issued there); the pool's context only when the thread has none.
  retire(p, {{stream, current_or(t_, ctx_)}}, nullptr, false);
}

void HostPool::free_after_context(void* p, CUcontext ctx, bool every_stream) {
  retire(p, {}, ctx, every_stream);
}

void HostPool::retire(void* p, std::vector<NamedStream> streams, CUcontext after,
                    bool every_stream) {
  auto it = blocks_.find(addr(p));
  if (it == blocks_.end()) {
    throw usage_error("expanse: host free of " + hex(addr(p)) + ": " + describe(p) +
                      "; nothing was changed");
  }
  order_.add_free(it->first, it->second.extent, it->second.users, std::move(streams), after,
                  every_stream);
  stats_.requested_bytes -= it->second.size;
  stats_.allocated_bytes -= it->second.extent;
  --stats_.live_blocks;
  ++stats_.num_frees;
  blocks_.erase(it);
}

void HostPool::record_stream(void* p, CUstream stream) {
  auto it = blocks_.find(addr(p));
  if (it == blocks_.end()) {
    throw usage_error("expanse: host record_stream of " + hex(addr(p)) + ": " + describe(p) +
                      "; nothing was changed");
  }
  it->second.users.name(t_, stream);
}

void HostPool::release_cached() {
  ContextScope current(t_, ctx_);
  if (may_poll()) {
    // Blocks freed after a device wait for a synchronize: a release is the time to make it.
    if (order_.context_pending_bytes() != 0) order_.sync_contexts();
    poll_pending(false);
  }
  for (size_t i = 0; i < pages_.size();) {
    if (pages_[i] == 0 || users_[i] != 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < pages_.size() && pages_[j] != 0 && users_[j] == 0) ++j;
    check(t_.mem_unmap(static_cast<CUdeviceptr>(base_ + i * page_), (j - i) * page_),
          "cuMemUnmap");
    for (size_t k = i; k < j; ++k) {
      unmapped_.push_back(pages_[k]);
      pages_[k] = 0;
      --mapped_pages_;
      ungranted_.erase(k);
    }
    i = j;
  }
  while (!unmapped_.empty()) {
    check(t_.mem_release(unmapped_.back()), "cuMemRelease");
    unmapped_.pop_back();
    ++stats_.num_released_pages;
  }
}

void HostPool::set_limit(size_t bytes) {
  limit_ = bytes;
  if ((mapped_pages_ + unmapped_.size()) * page_ > limit_) release_cached();
}

HostPoolStats HostPool::stats() const {
  HostPoolStats s = stats_;
  s.pinned_bytes = (mapped_pages_ + unmapped_.size()) * page_;
  s.mapped_bytes = mapped_pages_ * page_;
  s.limit_bytes = limit_ == SIZE_MAX ? UINT64_MAX : limit_;
  s.pending_blocks = order_.pending();
  return s;
}

bool HostPool::block_of(const void* p, void** base, size_t* size) const {
  auto it = blocks_.upper_bound(addr(p));
  if (it == blocks_.begin()) return false;
  --it;
  if (addr(p) >= it->first + it->second.size) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second.size;
  return true;
}

std::string HostPool::describe(const void* p) const {
  const uintptr_t a = addr(p);
  auto it = blocks_.upper_bound(a);
  if (it != blocks_.begin()) {
    --it;
    if (it->first == a) return "a live host block of " + std::to_string(it->second.size) + " bytes";
    if (a < it->first + it->second.size) {
      return "an interior pointer, " + std::to_string(a - it->first) +
             " bytes into the host block at " + hex(it->first);
    }
  }
  if (order_.is_pending(a)) return "freed already (its stream's work may still be running)";
  if (contains(p)) return "not the start of a live host block (freed already, or never one)";
  return "not memory expanse_host_malloc returned";
}

}  // namespace expanse::core
