#include "core/sharing/imported_blocks.hpp"

#include "core/base/close_quietly.hpp"
#include "core/base/format.hpp"
#include "driver_api/error_names.hpp"
#include "expanse/errors.hpp"

#include <string>

namespace expanse::core {
CUdeviceptr ImportedBlocks::import(const std::vector<int>& fds,
                                   const std::vector<size_t>& handle_sizes, size_t offset) {
  size_t extent = 0;
  for (size_t s : handle_sizes) extent += s;
  ImportedBlock b;
  b.extent = extent;
  CUdeviceptr va = 0;
  size_t mapped = 0;  // bytes of va mapped so far
  // Each step runs once whatever the driver says (a second run would unmap, release and free what
  // may by then be another import's); a handle or range the driver will not take back yet is
  // kept for give_back_left, and a range whose unmap failed stays reserved.
  auto undo = [&]() noexcept {
    bool unmapped = true;
    if (mapped != 0) {
      try {
        drv_.unmap(va, mapped, b.handles.size());
      } catch (...) {
        unmapped = false;
      }
      mapped = 0;
    }
    for (const auto& [h, size] : b.handles) {
      try {
        drv_.release_imported(h, size);
      } catch (...) {
        try {
          left_handles_.emplace_back(h, size);
        } catch (...) {
        }
      }
    }
    b.handles.clear();
    if (va != 0 && unmapped) {
      try {
        drv_.address_free(va, extent);
      } catch (...) {
        try {
          left_ranges_.emplace_back(va, extent);
        } catch (...) {
        }
      }
    }
    va = 0;
  };
  try {
    va = drv_.reserve(extent, drv_.granularity());
    for (size_t i = 0; i < fds.size(); ++i) {
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = drv_.import_fd(fds[i], &h);
      if (r != CUDA_SUCCESS) {
        undo();
        const std::string where = "expanse: ipc import on device " +
                                  std::to_string(drv_.device()) + ": fd " +
                                  std::to_string(fds[i]) + " (handle " + std::to_string(i) +
                                  " of " + std::to_string(fds.size()) + "): ";
        // Out of memory and driver failures are not the fd's fault: said as what they are.
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
          throw out_of_memory(where + "the driver is out of memory to import it (" +
                                  code_name(r) + "); nothing was changed",
                              handle_sizes[i], drv_.device());
        }
        if (r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_INVALID_HANDLE &&
            r != CUDA_ERROR_NOT_PERMITTED && r != CUDA_ERROR_NOT_SUPPORTED) {
          throw driver_failure(where + "cuMemImportFromShareableHandle failed (" + code_name(r) +
                                   "); nothing was changed",
                               static_cast<int>(r));
        }
        throw usage_error(where + "the driver refuses it (" + code_name(r) +
                          "): not an fd expanse_ipc_export made, or closed, or its handle "
                          "already released; nothing was changed");
      }
      b.handles.emplace_back(h, handle_sizes[i]);
      int dev = -1;
      if (drv_.handle_device(h, &dev) == CUDA_SUCCESS && dev != drv_.device()) {
        undo();
        throw usage_error("expanse: ipc import on device " + std::to_string(drv_.device()) +
                          ": fd " + std::to_string(fds[i]) + " holds memory of device " +
                          std::to_string(dev) + " (import it with that device); nothing was "
                          "changed");
      }
      try {
        drv_.map(va + mapped, handle_sizes[i], h);
      } catch (const driver::driver_error& e) {
        // A size other than the handle's: NOT_SUPPORTED (only whole handles map) or INVALID_VALUE.
        if (e.code() != CUDA_ERROR_INVALID_VALUE && e.code() != CUDA_ERROR_NOT_SUPPORTED) throw;
        undo();
        throw usage_error("expanse: ipc import on device " + std::to_string(drv_.device()) +
                          ": handle_bytes[" + std::to_string(i) + "] of the handle says " +
                          std::to_string(handle_sizes[i]) + " bytes, but the driver will not "
                          "map fd " + std::to_string(fds[i]) + " at that size (" + e.what() +
                          "): a damaged expanse_ipc_handle; nothing was changed");
      }
      mapped += handle_sizes[i];
    }
    drv_.set_access(va, extent, b.handles.size());
  } catch (const usage_error&) {
    throw;
  } catch (...) {
    undo();
    throw;
  }
  bytes_ += extent;
  b.base = va;
  blocks_.emplace(va + offset, std::move(b));
  return va + offset;
}

void ImportedBlocks::close(CUdeviceptr ptr) {
  auto it = blocks_.find(ptr);
  // A failed unmap leaves the import as it was (mapped, its handles held): it stays in the books.
  drv_.unmap(it->second.base, it->second.extent, it->second.handles.size());
  const ImportedBlock b = std::move(it->second);
  blocks_.erase(it);
  bytes_ -= b.extent;
  // Unmapped, the import is closed whatever the driver says next: an error now would tell the
  // caller the address is still readable. A handle or range the driver will not take back yet is
  // kept and offered again at the next close and at shutdown.
  for (const auto& [h, size] : b.handles) left_handles_.emplace_back(h, size);
  left_ranges_.emplace_back(b.base, b.extent);
  give_back_left();
}

void ImportedBlocks::give_back_left() noexcept {
  auto handles = std::move(left_handles_);
  left_handles_.clear();
  for (const auto& [h, size] : handles) {
    try {
      drv_.release_imported(h, size);
    } catch (...) {
      left_handles_.emplace_back(h, size);
    }
  }
  auto ranges = std::move(left_ranges_);
  left_ranges_.clear();
  for (const auto& [va, extent] : ranges) {
    try {
      drv_.address_free(va, extent);
    } catch (...) {
      left_ranges_.emplace_back(va, extent);
    }
  }
}

void ImportedBlocks::grant_all() {
  for (const auto& [ptr, b] : blocks_) drv_.set_access(b.base, b.extent, b.handles.size());
}

void ImportedBlocks::close_all_quietly() noexcept {
  core::close_all_quietly(
      blocks_, [&](CUdeviceptr ptr) { close(ptr); },
      [&](const ImportedBlock& b) { bytes_ -= b.extent; });
  give_back_left();
}

}  // namespace expanse::core
