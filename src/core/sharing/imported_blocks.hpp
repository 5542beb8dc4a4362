// Blocks imported from other processes (docs/design.md, "Sharing across processes").
//
// An import reserves VA for the block's extent only (a whole number of granules), imports each
// exported handle (cuMemImportFromShareableHandle), maps them side by side, grants this device
// (and its peers) access, and returns the block's address in this process. Close unmaps,
// releases and frees that VA. Nothing is reserved for growth: a process importing 10,000 blocks
// of 2 MiB reserves 20 GiB, not 10,000 devices' worth.
#pragma once

#include "core/device/device_driver.hpp"

#include <cuda.h>

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace expanse::core {

struct ImportedBlock {
  CUdeviceptr base = 0;  // the reservation (the books key a block by base + offset)
  size_t extent = 0;     // VA reserved and mapped
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> handles;  // with their sizes
};

class ImportedBlocks {
 public:
  explicit ImportedBlocks(DeviceDriver& drv) : drv_(drv) {}
  ImportedBlocks(const ImportedBlocks&) = delete;
  ImportedBlocks& operator=(const ImportedBlocks&) = delete;

  // Imports fds (one per handle, of handle_sizes bytes each, in address order) and maps them;
  // returns the block's address: the mapping's base + offset (offset < handle_sizes[0]). Throws
  // expanse::usage_error for an fd the driver refuses, a handle the driver will not map at its
  // stated size, or memory of another device, driver::driver_error for other failures; nothing
  // is left behind.
  CUdeviceptr import(const std::vector<int>& fds, const std::vector<size_t>& handle_sizes,
                     size_t offset);
  // Whether ptr is an address import() returned here.
  bool has(CUdeviceptr ptr) const { return blocks_.count(ptr) != 0; }
  // Unmaps, releases, frees the VA (ptr: what import() returned). A failed unmap throws and
  // leaves the import as it was (in the books); after the unmap the close succeeds, and handles
  // or VA the driver refuses to take back are kept to be given back later (left_bytes()).
  void close(CUdeviceptr ptr);
  void grant_all();
  void close_all_quietly() noexcept;
  size_t count() const noexcept { return blocks_.size(); }
  size_t bytes() const noexcept { return bytes_; }

 private:
  // Offers the driver again what closes could not give back (keeps what it still refuses).
  void give_back_left() noexcept;

  DeviceDriver& drv_;
  std::map<CUdeviceptr, ImportedBlock> blocks_;  // by the address import() returned
  size_t bytes_ = 0;
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> left_handles_;
  std::vector<std::pair<CUdeviceptr, size_t>> left_ranges_;
};

}  // namespace expanse::core
