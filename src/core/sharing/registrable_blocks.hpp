// Registrable blocks: memory that other processes and NICs may map (docs/design.md, "Sharing
// across processes").
//
// Each block is one physical handle of its own (cuMemCreate with the device's exportable handle
// type and RDMA flag, its size rounded up to the page) mapped in a reservation of its own, so
// cuMemGetAddressRange and cuMemRetainAllocationHandle on any address in it answer that handle
// (what ncclCommRegister, ncclCommWindowRegister and nvidia_peermem need: one allocation per
// buffer), and exporting it hands out exactly its memory. These blocks are outside the page
// books: no other block ever shares their pages, reclaim, trim and sleep never see them, and a
// free unmaps and releases the handle at once (an importer's mapping keeps the memory alive), so
// an exported block's memory is never another block's.
#pragma once

#include "core/device/device_driver.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>

namespace expanse::core {

struct RegistrableBlock {
  size_t extent = 0;     // bytes mapped (the request rounded up to the page)
  size_t requested = 0;  // bytes asked for
  CUmemGenericAllocationHandle handle = 0;
  uint64_t pool = 0;      // the pool id it was allocated in (0: the default pool)
  bool exported = false;  // expanse_ipc_export has handed out its handle at least once
};

class RegistrableBlocks {
 public:
  RegistrableBlocks(DeviceDriver& drv, size_t page) : drv_(drv), page_(page) {}
  RegistrableBlocks(const RegistrableBlocks&) = delete;
  RegistrableBlocks& operator=(const RegistrableBlocks&) = delete;

  // Reserves, creates, maps and grants access (this device and its peers). Returns 0 when the
  // device is out of memory (CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate); throws
  // driver::driver_error for other failures. Nothing is left behind on either. given: a handle
  // of the block's extent to map instead of creating one (a reservation's pooled handle; on a
  // throw it is still the caller's).
  CUdeviceptr allocate(size_t bytes, uint64_t pool, CUmemGenericAllocationHandle given = 0);
  // The block starting at va, or nullptr.
  RegistrableBlock* find(CUdeviceptr va);
  const RegistrableBlock* find(CUdeviceptr va) const;
  // The block holding va anywhere in its extent (its start into *base), or nullptr.
  const RegistrableBlock* containing(CUdeviceptr va, CUdeviceptr* base) const;
  // Unmaps, releases and frees the VA of the block at va (which must exist). The caller has
  // made sure no work on it is pending. Throws driver::driver_error only when the unmap failed:
  // the block stays as it was (mapped, in the books: a later free may succeed). After the unmap
  // the block is freed whatever the driver says next. Returns the handle still held, or 0: with
  // keep, the handle unreleased (a reservation keeps its pages); without, a handle the driver
  // would not release. The caller pools it (its pages serve blocks and go at a later trim) or,
  // exported (other processes may map it: never reused), retires it. A VA range the driver
  // would not free stays reserved, unused.
  CUmemGenericAllocationHandle free(CUdeviceptr va, bool keep = false);
  // Grants every block's extent to the devices DeviceDriver grants (a peer was added).
  void grant_all();
  // Everything unmapped and released, errors swallowed (shutdown).
  void free_all_quietly() noexcept;

  size_t count() const noexcept { return blocks_.size(); }
  size_t bytes() const noexcept { return bytes_; }        // mapped = reserved, in bytes
  size_t requested() const noexcept { return requested_; }
  // Live blocks of pool `pool`, their requested and extent bytes, and whether one is exported.
  struct PoolFigures {
    size_t blocks = 0, requested = 0, bytes = 0;
    bool exported = false;
  };
  PoolFigures of_pool(uint64_t pool) const;
  const std::map<CUdeviceptr, RegistrableBlock>& all() const noexcept { return blocks_; }

 private:
  DeviceDriver& drv_;
  size_t page_;
  std::map<CUdeviceptr, RegistrableBlock> blocks_;
  size_t bytes_ = 0;
  size_t requested_ = 0;
};

}  // namespace expanse::core
