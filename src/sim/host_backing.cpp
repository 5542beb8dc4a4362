#include "sim/host_backing.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace expanse::sim::detail {
namespace {

constexpr int kReserveFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

void* as_ptr(uintptr_t a) noexcept { return reinterpret_cast<void*>(a); }
uintptr_t as_addr(void* p) noexcept { return reinterpret_cast<uintptr_t>(p); }

// Reservations are placed bottom-up from a cursor, like CUDA's VA allocator: consecutive
// reservations are adjacent and a hint right after the last one is usually free (the kernel's
// own placement is top-down, which would make every "grow in place" hint fail). The cursor area
// starts above ASan's shadow; under TSan, whose layout allows no such area, only the kernel
// places reservations. Anything already there is skipped (MAP_FIXED_NOREPLACE).
#if defined(__SANITIZE_THREAD__)
constexpr bool kUseCursor = false;
#else
constexpr bool kUseCursor = sizeof(void*) == 8;
#endif
constexpr uintptr_t kCursorBase = uintptr_t{0x2000} << 32;   // 32 TiB
constexpr uintptr_t kCursorLimit = uintptr_t{0x7000} << 32;  // 112 TiB
uintptr_t g_cursor = kCursorBase;                            // guarded by the sim's lock

bool try_fixed(uintptr_t at, size_t size) noexcept {
  void* p = mmap(as_ptr(at), size, PROT_NONE, kReserveFlags | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) return false;
  if (as_addr(p) == at) return true;
  munmap(p, size);  // a kernel that treats MAP_FIXED_NOREPLACE as a plain hint
  return false;
}

}  // namespace

size_t host_page_size() noexcept {
  static const size_t page = [] {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

uintptr_t va_reserve(size_t size, size_t alignment, uintptr_t hint) noexcept {
  if (size == 0 || alignment == 0) return 0;
  if (hint != 0 && hint % alignment == 0 && hint + size > hint && try_fixed(hint, size)) {
    if (hint + size > g_cursor && hint < kCursorLimit) g_cursor = hint + size;
    return hint;
  }
  if (size > SIZE_MAX - alignment) return 0;
  for (int attempt = 0; kUseCursor && attempt < 4; ++attempt) {
    const uintptr_t at = (g_cursor + alignment - 1) & ~(uintptr_t{alignment} - 1);
    if (at < g_cursor || at > kCursorLimit || size > kCursorLimit - at) break;
    if (try_fixed(at, size)) {
      g_cursor = at + size;
      return at;
    }
    g_cursor = at + std::max<size_t>(size, size_t{1} << 30);  // something lives there: skip ahead
  }
  const size_t span = size + alignment;
  void* p = mmap(nullptr, span, PROT_NONE, kReserveFlags, -1, 0);
  if (p == MAP_FAILED) return 0;
  const uintptr_t raw = as_addr(p);
  const uintptr_t aligned = (raw + alignment - 1) & ~(uintptr_t{alignment} - 1);
  if (aligned > raw) munmap(p, aligned - raw);
  const uintptr_t end = aligned + size;
  const uintptr_t raw_end = raw + span;
  if (raw_end > end) munmap(as_ptr(end), raw_end - end);
  return aligned;
}

void va_release(uintptr_t base, size_t size) noexcept {
  munmap(as_ptr(base), size);
  if (base + size == g_cursor && base >= kCursorBase) g_cursor = base;  // the top comes back
}

bool va_map_file(uintptr_t va, size_t size, int fd, uint64_t offset) noexcept {
  void* p =
      mmap(as_ptr(va), size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    va_unmap_to_reserved(va, size);
    return false;
  }
  return true;
}

bool va_unmap_to_reserved(uintptr_t va, size_t size) noexcept {
  void* p = mmap(as_ptr(va), size, PROT_NONE, kReserveFlags | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

bool va_protect(uintptr_t va, size_t size, int access_flags) noexcept {
  int prot = PROT_NONE;
  if (access_flags == 1) prot = PROT_READ;
  if (access_flags == 3) prot = PROT_READ | PROT_WRITE;
  return mprotect(as_ptr(va), size, prot) == 0;
}

namespace {
constexpr char kHandlePrefix[] = "expanse-sim-handle-d";
}  // namespace

int handle_memfd_create(int device, size_t size) noexcept {
  const std::string name = kHandlePrefix + std::to_string(device);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool copy_extent(int src_fd, uint64_t offset, int dst_fd, size_t size) noexcept {
  const auto end = static_cast<off_t>(offset + size);
  auto at = static_cast<off_t>(offset);
  std::vector<char> buf(size_t{1} << 20);
  while (at < end) {
    off_t data = lseek(src_fd, at, SEEK_DATA);
    if (data < 0) return errno == ENXIO;  // no data after `at`: the rest is a hole
    if (data >= end) return true;
    off_t hole = lseek(src_fd, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    for (off_t p = data; p < hole;) {
      const size_t n = std::min<size_t>(buf.size(), static_cast<size_t>(hole - p));
      const ssize_t got = pread(src_fd, buf.data(), n, p);
      if (got <= 0) return false;
      const off_t to = p - static_cast<off_t>(offset);
      if (pwrite(dst_fd, buf.data(), static_cast<size_t>(got), to) != got) return false;
      p += got;
    }
    at = hole;
  }
  return true;
}

bool handle_memfd_identity(int fd, int* device, size_t* size) noexcept {
  if (fd < 0) return false;
  char link[64];
  char target[256];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  const std::string t(target);
  const std::string want = std::string("/memfd:") + kHandlePrefix;
  if (t.compare(0, want.size(), want) != 0) return false;
  int d = -1;
  if (std::sscanf(t.c_str() + want.size(), "%d", &d) != 1 || d < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  *device = d;
  *size = static_cast<size_t>(st.st_size);
  return true;
}

PhysicalStore::~PhysicalStore() {
  if (fd_ >= 0) close(fd_);
}

bool PhysicalStore::ensure_open(const std::string& name, size_t initial_size, std::string* error) {
  if (fd_ >= 0) return true;
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    if (error != nullptr) *error = std::string("memfd_create: ") + std::strerror(errno);
    return false;
  }
  if (ftruncate(fd, static_cast<off_t>(initial_size)) != 0) {
    if (error != nullptr) *error = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    return false;
  }
  fd_ = fd;
  file_size_ = initial_size;
  return true;
}

bool PhysicalStore::allocate(size_t size, uint64_t* offset) {
  auto best = by_size_.lower_bound({size, 0});
  if (best != by_size_.end()) {
    const uint64_t off = best->second;
    const uint64_t have = best->first;
    erase_free(by_offset_.find(off));
    if (have > size) insert_free(off + size, have - size);
    *offset = off;
    return true;
  }
  if (end_ + size > file_size_) {
    uint64_t want = std::max<uint64_t>(end_ + size, file_size_ + file_size_ / 2);
    if (ftruncate(fd_, static_cast<off_t>(want)) != 0) {
      want = end_ + size;
      if (ftruncate(fd_, static_cast<off_t>(want)) != 0) return false;
    }
    file_size_ = want;
  }
  *offset = end_;
  end_ += size;
  return true;
}

void PhysicalStore::free(uint64_t offset, size_t size) {
  if (fd_ >= 0) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(size));
  }
  insert_free(offset, size);
}

size_t PhysicalStore::resident_bytes() const noexcept {
  if (fd_ < 0) return 0;
  struct stat st;
  if (fstat(fd_, &st) != 0) return 0;
  return static_cast<size_t>(st.st_blocks) * 512;
}

void PhysicalStore::insert_free(uint64_t offset, uint64_t size) {
  // Coalesce with the free neighbours.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && offset + size == next->first) {
    size += next->second;
    erase_free(next);
  }
  if (offset + size == end_) {
    end_ = offset;  // the tail comes back to the never-used region
    return;
  }
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
}

void PhysicalStore::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

}  // namespace expanse::sim::detail
