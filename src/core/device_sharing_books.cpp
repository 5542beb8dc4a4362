// DeviceAllocator's registrable blocks and imports (registrable_blocks.hpp, imported_blocks.hpp):
// allocation, free, export, import and close, with the books (stats, pages against the limit).
#include "core/device_allocator.hpp"
#include "core/base/format.hpp"
#include "conf/env_config.hpp"
#include "driver_api/error_names.hpp"
#include "expanse/errors.hpp"

#include <algorithm>

namespace expanse::core {
void* DeviceAllocator::allocate_registrable(size_t bytes, uint64_t pool, CUstream stream) {
  const size_t extent = round_up(bytes, page_);
  const size_t pages = extent / page_;
  auto oom = [&](const std::string& why) {
    ++stats_.num_ooms;
    if (events_ != nullptr) events_->on_oom(device(), bytes, stream, supply_.pages_left() * page_);
    throw out_of_memory("expanse: out of memory on device " + std::to_string(device()) +
                            ": asked for a registrable block of " + conf::format_size(bytes) +
                            " (" + std::to_string(bytes) + " bytes, one handle of " +
                            conf::format_size(extent) + "); " + why,
                        bytes, device());
  };
  if (pages > supply_.pages_left()) {
    oom("the pages do not exist (" + std::to_string(supply_.pages_left()) + " pages of " +
        conf::format_size(page_) + " left)");
  }
  try {
    // Cached pages give way to it, as they do to any block (invariant 1). The reservation's
    // pooled pages give way too, but only once its handle exists (what the held pages exceed the
    // reservation by then goes): its handle is held memory, so the block takes its share of the
    // reservation and the reservation never dips. With reserve_may_dip they go first.
    const size_t cap = std::min(supply_.limit_pages(), supply_.capacity_pages());
    const size_t reserved = supply_.reserved_pages();
    const bool first = supply_.guards_reserve();
    const size_t floor = first ? reserved : (reserved > pages ? reserved - pages : 0);
    const std::string dip_hint =
        first ? "; the reservation's pooled pages give way only once its handle exists "
                "(reserve_may_dip:true lets them go first)"
              : "";
    // A pooled reserved handle of its extent serves it as it is: nothing created, nothing
    // released, the reservation's pages in use.
    CUdeviceptr va = 0;
    bool from_pool = false;
    if (reserved > 0 && supply_.pooled_has(pages)) {
      const CUmemGenericAllocationHandle h = supply_.take_pooled(pages);
      try {
        va = registrable_.allocate(bytes, pool, h);
      } catch (...) {
        supply_.keep_pooled(pages, h);
        throw;
      }
      from_pool = true;
    }
    if (va == 0 && supply_.held_pages() + pages > cap) {
      streams_.poll(true);
      supply_.trim_to(cap > pages ? cap - pages : 0, floor);
    }
    if (va == 0 && supply_.held_pages() + pages > cap) {
      oom("its pages would take the memory held past the limit of " +
          conf::format_size(cap * page_) + " (" + conf::format_size(supply_.held_pages() * page_) +
          " held" +
          (reserved > 0 ? ", a reservation of " + conf::format_size(reserved * page_) : "") +
          ")" + dip_hint);
    }
    if (va == 0) va = registrable_.allocate(bytes, pool);
    if (va == 0) {  // the device is out of memory: give every cached page back, once
      streams_.poll(true);
      supply_.trim_to(supply_.touched_pages(), floor);
      va = registrable_.allocate(bytes, pool);
    }
    if (va == 0) {
      oom("cuMemCreate answered CUDA_ERROR_OUT_OF_MEMORY with every cached page given back" +
          std::string(reserved > 0 && !first ? " (the reservation's unused pages included)"
                                             : "") +
          dip_hint);
    }
    supply_.add_outside_pages(pages);
    if (first && !from_pool) {
      try {
        supply_.shed_pooled(pages);  // its share of the reservation: best effort
      } catch (...) {
      }
    }
    if (pool != 0) ++pools_.at(pools_.slot_of(pool)).registrable_blocks;
    stats_.requested_bytes += bytes;
    stats_.allocated_bytes += extent;
    ++stats_.live_blocks;
    ++stats_.num_allocs;
    if (!from_pool) stats_.num_created_pages += pages;
    peaks_after_allocation_locked();
    stats_.peak_va_reserved_bytes =
        std::max<uint64_t>(stats_.peak_va_reserved_bytes,
                           placement_.va_reserved() + registrable_.bytes() + imports_.bytes());
    supply_.note_peaks(0);
    return reinterpret_cast<void*>(va);
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: allocating a registrable block of " + std::to_string(bytes) +
                             " bytes on device " + std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::sync_for_unmap(const std::string& what, CUstream stream) {
  bool not_capturing = false;
  {
    // NULL and CU_STREAM_PER_THREAD name the current context's streams: the device's own here.
    DeviceDriver::ScopedContext scope(drv_);
    not_capturing = scope.ok() && drv_.surely_not_capturing(stream);
  }
  if (!not_capturing) {
    throw usage_error("expanse: " + what + " on device " + std::to_string(device()) +
                      ": stream " + stream_name(stream) +
                      " is capturing (or cannot be asked): the memory is unmapped at once, "
                      "after the device's work; do it after the capture ends; nothing was "
                      "changed");
  }
  // Every context that may use the memory: this device's, every peer's granted access (a kernel
  // there may read it), and those of the streams known here (record_stream).
  std::vector<CUcontext> contexts{drv_.primary()};
  for (CUcontext c : drv_.peer_contexts()) contexts.push_back(c);
  for (CUcontext c : streams_.contexts()) {
    if (std::find(contexts.begin(), contexts.end(), c) == contexts.end()) contexts.push_back(c);
  }
  for (CUcontext c : contexts) {
    if (streams_.sync_context(c)) continue;
    const std::string whose = c == drv_.primary() ? std::string("the device")
                                                  : std::string("a peer device or a recorded stream");
    const CUresult r = streams_.last_sync_failure();
    if (r != CUDA_SUCCESS) {
      // The work cannot be waited for (a sticky error of a faulted kernel, a lost device): the
      // driver's failure, not a capture to wait out.
      throw driver_failure("expanse: " + what + " on device " + std::to_string(device()) +
                               ": cuCtxSynchronize failed (" + code_name(r) +
                               ") waiting for the work of " + whose + "; nothing was changed",
                           static_cast<int>(r));
    }
    throw usage_error("expanse: " + what + " on device " + std::to_string(device()) +
                      ": the work of " + whose +
                      " cannot be waited for now (a capture is announced in its context); try "
                      "again after the capture ends; nothing was changed");
  }
}

void DeviceAllocator::free_registrable(CUdeviceptr addr, CUstream stream, size_t expected_size) {
  const RegistrableBlock& b = *registrable_.find(addr);
  if (expected_size != 0 && expected_size != b.requested) {
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      " with size " + std::to_string(expected_size) +
                      ", but it was allocated with size " + std::to_string(b.requested) +
                      "; nothing was changed");
  }
  // Its handle is unmapped and released at once (never reused for another block), so the work
  // that may use it must be done first (invariant 3).
  sync_for_unmap("free of the registrable block " + hex(addr), stream);
  const size_t extent = b.extent;
  const size_t requested = b.requested;
  const uint64_t pool = b.pool;
  if (pool != 0) make_room_to_forget_pool(pools_.slot_of(pool));  // books() then cannot throw
  // Under a reservation its pages go only once the reservation is whole without them: what it
  // lacks then is created first; where the device has no room for that, the handle is kept
  // instead of released: pooled, its pages serving blocks, or if exported (its importers may map
  // it still, so no block may use it) retired until a replacement exists. kept: the handle still
  // held after the free (kept, or one the driver would not release).
  CUmemGenericAllocationHandle kept = 0;
  bool keep = false;
  const bool exported = b.exported;
  if (supply_.guards_reserve()) {
    const size_t whole = supply_.reserved_pages() + extent / page_;
    if (supply_.held_pages() < whole) supply_.top_up(whole);
    keep = supply_.held_pages() < whole;
  }
  auto books = [&] {
    if (pool != 0) {
      const PoolSlot s = pools_.slot_of(pool);
      PoolState& p = pools_.at(s);
      --p.registrable_blocks;
      // Released with this block live: forgotten with its last block, as plain pools are.
      if (p.use_count == 0 && p.registrable_blocks == 0 && p.live_blocks == 0) {
        p.returned = true;
        forget_pool(s);
      }
    }
    supply_.remove_outside_pages(extent / page_);
    if (kept != 0 && exported) {
      supply_.retire(extent / page_, kept);
    } else if (kept != 0) {
      supply_.keep_pooled(extent / page_, kept);
    }
    // Its pages were the reservation's share too: the reservation stays whole.
    if (supply_.held_pages() < supply_.reserved_pages()) supply_.top_up();
    stats_.requested_bytes -= requested;
    stats_.allocated_bytes -= extent;
    --stats_.live_blocks;
    ++stats_.num_frees;
    if (kept == 0) stats_.num_released_pages += extent / page_;
  };
  try {
    kept = registrable_.free(addr, keep);
  } catch (const driver::driver_error& e) {
    // A failed unmap keeps the block live, nothing changed: a later free may succeed.
    throw driver_failure("expanse: free of the registrable block " + hex(addr) + " on device " +
                             std::to_string(device()) + ": " + e.what() +
                             "; nothing was changed (the block is live)",
                         static_cast<int>(e.code()));
  }
  books();
}

DeviceAllocator::Export DeviceAllocator::export_block(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  const std::string at = "expanse: ipc export of " + hex(addr) + " on device " +
                         std::to_string(device()) + ": ";
  RegistrableBlock* b = registrable_.find(addr);
  if (b == nullptr) {
    CUdeviceptr base = 0;
    if (registrable_.containing(addr, &base) != nullptr) {
      throw usage_error(at + "interior pointer, " + std::to_string(addr - base) +
                        " bytes into the registrable block at " + hex(base) +
                        ": export the block's start; nothing was changed");
    }
    const auto& blocks = placement_.index().blocks();
    auto it = blocks.find(addr);
    if (it != blocks.end() && it->second.state == BlockState::live) {
      throw usage_error(at + "a block whose pages other blocks may share, so it cannot be "
                             "exported: allocate memory to share in a registrable pool "
                             "(expanse_pool_create_registrable) or with EXPANSE_CONF "
                             "registrable:on; nothing was changed");
    }
    throw usage_error(at + describe_pointer_locked(ptr) + "; nothing was changed");
  }
  if (!drv_.posix_fd_handles()) {
    throw usage_error(at + "the device cannot export POSIX file descriptors "
                           "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is "
                           "0), so its handles were created without them; nothing was changed");
  }
  Export out;
  const CUresult r = drv_.export_fd(b->handle, &out.fd);
  if (r != CUDA_SUCCESS) {
    throw driver_failure(at + "cuMemExportToShareableHandle failed with " + code_name(r),
                         static_cast<int>(r));
  }
  b->exported = true;
  out.extent = b->extent;
  out.requested = b->requested;
  return out;
}

void* DeviceAllocator::import_block(const std::vector<int>& fds, const std::vector<size_t>& sizes,
                                    size_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t g = drv_.granularity();
  size_t extent = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // The record came from another process: a handle no device could hold is refused here, by
    // name, before any VA is reserved for it.
    extent += std::min(sizes[i], drv_.total_memory());
    if (sizes[i] > drv_.total_memory() || extent > drv_.total_memory()) {
      throw usage_error("expanse: ipc import on device " + std::to_string(device()) +
                        ": handle_bytes[" + std::to_string(i) + "] of the handle is " +
                        std::to_string(sizes[i]) + ", more than the device's " +
                        std::to_string(drv_.total_memory()) + " bytes (with the handles before "
                        "it): a damaged expanse_ipc_handle; nothing was changed");
    }
    if (sizes[i] == 0 || sizes[i] % g != 0) {
      throw usage_error("expanse: ipc import on device " + std::to_string(device()) +
                        ": handle_bytes[" + std::to_string(i) + "] of the handle is " +
                        std::to_string(sizes[i]) + ", not a whole number of the device's " +
                        std::to_string(g) + "-byte granules: a damaged expanse_ipc_handle; "
                        "nothing was changed");
    }
  }
  try {
    const CUdeviceptr va = imports_.import(fds, sizes, offset);
    stats_.peak_va_reserved_bytes =
        std::max<uint64_t>(stats_.peak_va_reserved_bytes,
                           placement_.va_reserved() + registrable_.bytes() + imports_.bytes());
    return reinterpret_cast<void*>(va);
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: ipc import on device " + std::to_string(device()) + ": " +
                             e.what(),
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::close_import(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  if (!imports_.has(addr)) {
    throw usage_error("expanse: ipc close of " + hex(addr) + " on device " +
                      std::to_string(device()) +
                      ": not an address expanse_ipc_import returned (or closed already); "
                      "nothing was changed");
  }
  sync_for_unmap("ipc close of " + hex(addr), nullptr);
  try {
    imports_.close(addr);
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: ipc close of " + hex(addr) + " on device " +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

bool DeviceAllocator::is_import(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return imports_.has(reinterpret_cast<CUdeviceptr>(ptr));
}

bool DeviceAllocator::is_registrable(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  CUdeviceptr base = 0;
  return registrable_.containing(reinterpret_cast<CUdeviceptr>(ptr), &base) != nullptr;
}

}  // namespace expanse::core
