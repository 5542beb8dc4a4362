// Pinned host memory as fungible as device memory: one host NUMA node's pool.
//
// Physical pages are HOST_NUMA handles of one granule each (cuMemCreate on the node), mapped into
// one VA reservation with access for the host and for every device that allocated here. A block
// is exact at the granularity (a large one starts on a page, a small one is packed beside others
// at 512 bytes), and a request's pages come, in turn, from its range's pages already mapped, the
// pool of unmapped handles, new handles (within the limit), and pages under free memory anywhere
// (unmapped there and mapped again here): a contiguous request fits whenever the pages exist.
// Reuse is stream-ordered as PyTorch's host allocator orders it: a block freed with a stream
// (and the streams record_stream named) is reused only once an event recorded there at the free
// has completed; a request that finds nothing else waits for those events.
//
// One handle per page costs a cuMemMap per page; pinning host memory costs more per byte than the
// calls do per page (docs/design.md, "Pinned host memory"). Not thread-safe: the caller locks.
#pragma once

#include "core/host/host_free_order.hpp"
#include "core/host/host_memory.hpp"
#include "driver_api/driver_table.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace expanse::core {

// The properties of a page on host NUMA node `node` (what the pool creates, and what a probe asks).
CUmemAllocationProp host_prop(int node);

class HostPool final : public HostMemory {
 public:
  // t: the loaded driver; node: the host NUMA node; ctx: the context VMM calls run in (made
  // current around them), that of device `owner`; devices: how many devices every page is
  // granted to (pinned host memory is every device's, as cuMemHostAlloc's portable memory is; a
  // device the driver refuses is dropped and owner kept); limit: most bytes of pages held
  // (SIZE_MAX: none). Reserves the VA. Throws driver_failure when the driver cannot (a device
  // without HOST_NUMA VMM: the caller probes first).
  HostPool(const driver::DriverTable& t, int node, CUcontext ctx, int owner, int devices,
           size_t limit, size_t va_bytes);
  ~HostPool();  // gives every page and the VA back (live blocks included: only at shutdown)
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of `size` bytes, reusable when stream's work is done once it is freed. device: the
  // ordinal to grant access to (its pages and every later page), or -1. Throws out_of_memory
  // when the pages do not exist within the limit, usage_error for a size of 0, driver_failure;
  // nothing changes on a throw.
  void* allocate(size_t size, CUstream stream, int device) override;
  // Frees a live block (after the work on stream, and on the streams record_stream named).
  void free(void* p, CUstream stream) override;
  void free_after_context(void* p, CUcontext ctx, bool every_stream) override;
  void record_stream(void* p, CUstream stream) override;
  // Unmaps and releases every page no live or pending block touches.
  void release_cached() override;
  void set_limit(size_t bytes) override;
  void reset_peak() override;
  HostPoolStats stats() const override;
  HostPath path() const override { return HostPath::vmm; }

  bool is_live(const void* p) const { return blocks_.count(addr(p)) != 0; }
  // Whether p lies in this pool's VA (a live block's start or not).
  bool block_of(const void* p, void** base, size_t* size) const override;
  bool contains(const void* p) const override {
    return addr(p) >= base_ && addr(p) < base_ + va_bytes_;
  }
  // "a live block of N bytes", "inside the block at X", "freed", ...: for messages.
  std::string describe(const void* p) const;
  size_t page() const noexcept { return page_; }
  int node() const noexcept { return node_; }

 private:
  struct Block {
    size_t size = 0;    // as asked
    size_t extent = 0;  // as placed
    BlockUsers users;  // record_stream's streams, and the context it was allocated in
  };
  static uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  void check(CUresult r, const char* call) const;
  // VA: free byte ranges (offset -> size), coalesced.
  bool take_range(size_t extent, bool page_aligned, size_t* offset);
  void give_range(size_t offset, size_t extent);
  // Pages: users_ counts live and pending blocks touching each page.
  void touch(size_t first, size_t last);
  void untouch(size_t first, size_t last);
  bool back_pages(size_t first, size_t last, int device);
  bool mapped(size_t first, size_t last) const;  // every page mapped and granted
  size_t pages_lacking(size_t first, size_t last) const;  // pages of the range not mapped
  // Frees the live block at p: its books, and its place in the free order
  // (HostFreeOrder::add_free, which says what the free waits for).
  void retire(void* p, std::vector<NamedStream> streams, CUcontext after, bool every_stream);
  CUmemGenericAllocationHandle page_handle(size_t avoid_first, size_t avoid_last);
  void map_page(size_t i, CUmemGenericAllocationHandle h);
  void grant(uintptr_t va, size_t bytes);
  void add_device(int device);
  bool poll_pending(bool wait);
  void note_peak();

  const driver::DriverTable& t_;
  int node_;
  CUcontext ctx_;
  int owner_;
  size_t limit_;
  size_t page_ = 0;
  size_t va_bytes_ = 0;
  uintptr_t base_ = 0;
  std::map<size_t, size_t> free_ranges_;             // byte offset -> bytes
  std::vector<CUmemGenericAllocationHandle> pages_;  // per page: mapped handle or 0
  std::vector<uint32_t> users_;                      // per page
  std::vector<CUmemGenericAllocationHandle> unmapped_;
  std::map<uintptr_t, Block> blocks_;
  HostFreeOrder order_;
  std::set<int> devices_;  // granted access on every mapped page
  std::set<size_t> ungranted_;  // mapped pages whose access grant failed (granted before use)
  size_t mapped_pages_ = 0;
  size_t reclaim_from_ = 0;  // where page_handle's search for a page to move goes on
  HostPoolStats stats_;
};

}  // namespace expanse::core
