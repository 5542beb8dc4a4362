#include "core/sharing/registrable_blocks.hpp"

#include "core/base/close_quietly.hpp"

#include "core/base/options.hpp"

namespace expanse::core {

CUdeviceptr RegistrableBlocks::allocate(size_t bytes, uint64_t pool,
                                        CUmemGenericAllocationHandle given) {
  const size_t extent = round_up(bytes, page_);
  const CUdeviceptr va = drv_.reserve(extent, page_);
  CUmemGenericAllocationHandle h = given;
  try {
    if (h == 0 && drv_.create(extent, &h) != CUDA_SUCCESS) {
      drv_.address_free(va, extent);
      return 0;
    }
  } catch (...) {
    try {
      drv_.address_free(va, extent);
    } catch (...) {
    }
    throw;
  }
  bool mapped = false;
  try {
    drv_.map(va, extent, h);
    mapped = true;
    drv_.set_access(va, extent, 1);
  } catch (...) {
    try {
      if (mapped) drv_.unmap(va, extent, 1);
      if (given == 0) drv_.release(h, extent);  // a given handle stays the caller's
      drv_.address_free(va, extent);
    } catch (...) {
    }
    throw;
  }
  RegistrableBlock& b = blocks_[va];
  b.extent = extent;
  b.requested = bytes;
  b.handle = h;
  b.pool = pool;
  bytes_ += extent;
  requested_ += bytes;
  return va;
}

RegistrableBlock* RegistrableBlocks::find(CUdeviceptr va) {
  auto it = blocks_.find(va);
  return it == blocks_.end() ? nullptr : &it->second;
}

const RegistrableBlock* RegistrableBlocks::find(CUdeviceptr va) const {
  auto it = blocks_.find(va);
  return it == blocks_.end() ? nullptr : &it->second;
}

const RegistrableBlock* RegistrableBlocks::containing(CUdeviceptr va, CUdeviceptr* base) const {
  auto it = blocks_.upper_bound(va);
  if (it == blocks_.begin()) return nullptr;
  --it;
  if (va >= it->first + it->second.extent) return nullptr;
  *base = it->first;
  return &it->second;
}

CUmemGenericAllocationHandle RegistrableBlocks::free(CUdeviceptr va, bool keep) {
  auto it = blocks_.find(va);
  const RegistrableBlock b = it->second;
  // A failed unmap leaves the block as it was (mapped, its handle held): it stays in the books.
  drv_.unmap(va, b.extent, 1);
  blocks_.erase(it);
  bytes_ -= b.extent;
  requested_ -= b.requested;
  CUmemGenericAllocationHandle held = keep ? b.handle : 0;
  if (!keep) {
    try {
      drv_.release(b.handle, b.extent);
    } catch (const driver::driver_error&) {
      held = b.handle;
    }
  }
  try {
    drv_.address_free(va, b.extent);
  } catch (const driver::driver_error&) {
  }
  return held;
}

void RegistrableBlocks::grant_all() {
  for (const auto& [va, b] : blocks_) drv_.set_access(va, b.extent, 1);
}

void RegistrableBlocks::free_all_quietly() noexcept {
  close_all_quietly(
      blocks_, [&](CUdeviceptr va) { free(va); },
      [&](const RegistrableBlock& b) {
        bytes_ -= b.extent;
        requested_ -= b.requested;
      });
}

RegistrableBlocks::PoolFigures RegistrableBlocks::of_pool(uint64_t pool) const {
  PoolFigures f;
  for (const auto& [va, b] : blocks_) {
    if (b.pool != pool) continue;
    ++f.blocks;
    f.requested += b.requested;
    f.bytes += b.extent;
    f.exported = f.exported || b.exported;
  }
  return f;
}

}  // namespace expanse::core
