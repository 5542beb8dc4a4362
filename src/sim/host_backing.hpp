// Host memory behind the sim's device pages (internal to sim/).
//
// VA: every reservation is one host mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), so
// its addresses are unique in the process and cost no memory. cuMemMap replaces a piece of it
// with a MAP_SHARED|MAP_FIXED mapping of the allocation's extent of its device's memfd;
// cuMemSetAccess mprotects; cuMemUnmap puts the anonymous PROT_NONE reservation back.
//
// Physical memory: one sparse memfd per device. An allocation owns a contiguous extent of file
// offsets; freed extents are reused (best fit) and their pages returned to the OS at once
// (fallocate PUNCH_HOLE). Only touched pages use RAM, and there is never one fd per handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace expanse::sim::detail {

// The host page size (sysconf), cached.
size_t host_page_size() noexcept;

// Reserves size bytes of PROT_NONE VA aligned to `alignment` (a power of two, >= host page),
// at `hint` when that exact range is free (hint != 0 and aligned). Otherwise reservations are
// placed bottom-up from a cursor (32 TiB up), so consecutive reservations are adjacent and a
// hint at the end of the last one is usually free, as with CUDA's own VA allocator; failing
// that (or under TSan), wherever the kernel puts them. Returns 0 when the host has no VA left.
// Not thread-safe (the sim's lock serializes callers).
uintptr_t va_reserve(size_t size, size_t alignment, uintptr_t hint) noexcept;
// Returns a whole reservation to the OS.
void va_release(uintptr_t base, size_t size) noexcept;
// Maps [va, va+size) to [offset, offset+size) of fd, MAP_SHARED, PROT_NONE. On failure the range
// is turned back into plain reserved VA (best effort) and false is returned.
bool va_map_file(uintptr_t va, size_t size, int fd, uint64_t offset) noexcept;
// Turns [va, va+size) back into plain PROT_NONE reserved VA. False on failure.
bool va_unmap_to_reserved(uintptr_t va, size_t size) noexcept;
// mprotect with 0 (none), 1 (read) or 3 (read+write). False on failure.
bool va_protect(uintptr_t va, size_t size, int access_flags) noexcept;

// Exportable allocations (cuMemExportToShareableHandle): an allocation gets a memfd of its own
// when it is first exported, so the fd handed out is a real file another process can map (after
// fork, or received over a Unix socket). The memfd's name carries the device
// ("expanse-sim-handle-d<device>"), so an importer in another process learns which device's
// memory it holds.
//
// A new sparse memfd of `size` bytes for device's memory; -1 on failure.
int handle_memfd_create(int device, size_t size) noexcept;
// Copies [offset, offset+size) of src_fd to the start of dst_fd, only where src has data (holes
// stay holes). False on failure.
bool copy_extent(int src_fd, uint64_t offset, int dst_fd, size_t size) noexcept;
// Whether fd is a memfd made by handle_memfd_create (in this process or another): its device
// and size. False for anything else (a closed fd, another file).
bool handle_memfd_identity(int fd, int* device, size_t* size) noexcept;

// One device's physical memory: a sparse memfd carved into extents.
class PhysicalStore {
 public:
  PhysicalStore() = default;
  ~PhysicalStore();
  PhysicalStore(const PhysicalStore&) = delete;
  PhysicalStore& operator=(const PhysicalStore&) = delete;

  // Creates the memfd on first use (name for /proc/self/maps). False + *error on failure.
  bool ensure_open(const std::string& name, size_t initial_size, std::string* error);
  int fd() const noexcept { return fd_; }

  // A free extent of `size` bytes (best fit, else grows the file). False when the file cannot
  // grow.
  bool allocate(size_t size, uint64_t* offset);
  // Returns the extent and its pages (the RAM is given back to the OS).
  void free(uint64_t offset, size_t size);

  // Bytes of RAM the file holds now (st_blocks * 512).
  size_t resident_bytes() const noexcept;
  // Number of free extents (fragmentation of the file offset space; for tests).
  size_t free_extents() const noexcept { return by_offset_.size(); }

 private:
  void insert_free(uint64_t offset, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  int fd_ = -1;
  uint64_t file_size_ = 0;                  // ftruncate'd size
  uint64_t end_ = 0;                        // offsets >= end_ were never handed out (or came back)
  std::map<uint64_t, uint64_t> by_offset_;  // free extents: offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // free extents: (size, offset)
};

}  // namespace expanse::sim::detail
