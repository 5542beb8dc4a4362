// The sim's sharing entry points: cuMemExportToShareableHandle, cuMemImportFromShareableHandle
// and cuMemGetAddressRange_v2 (what NCCL registration and inter-process sharing call, with
// cuMemRetainAllocationHandle in sim_vmm.cpp).
//
// An exported fd is real: the allocation's bytes move to a memfd of its own at its first export
// (host_backing.hpp), and the fd handed out is a duplicate of it, so another process that
// receives it (fork, SCM_RIGHTS) imports and maps the same bytes. Only POSIX file descriptors
// are supported (no fabric handles: sim devices have no IMEX channel).
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <utility>
#include <vector>

namespace expanse::sim {
namespace {

// Gives allocation a a memfd of its own (once): its bytes are copied there from the device's
// memfd and every mapping of it is moved over, keeping its access. False (nothing changed) when
// the host refuses. Writes made through a mapping while it moves may be lost: export memory
// nobody is writing to.
bool give_own_memfd(State& s, Allocation& a) {
  if (a.own_fd >= 0) return true;
  const int fd = detail::handle_memfd_create(a.device, a.size);
  if (fd < 0) return false;
  Device& d = device(s, a.device);
  if (s.cfg.backing && !detail::copy_extent(d.store.fd(), a.offset, fd, a.size)) {
    close(fd);
    return false;
  }
  if (s.cfg.backing) {
    std::vector<uintptr_t> moved;
    for (auto& [va, m] : s.mappings) {
      if (m.alloc != &a) continue;
      if (!detail::va_map_file(va, m.size, fd, 0)) {
        // Undo: the moved mappings (and this one, now plain reserved VA) go back to the store.
        for (uintptr_t back : moved) detail::va_map_file(back, a.size, d.store.fd(), a.offset);
        detail::va_map_file(va, m.size, d.store.fd(), a.offset);
        for (uintptr_t back : moved) detail::sync_host_protection(s, back, a.size);
        detail::sync_host_protection(s, va, m.size);
        close(fd);
        return false;
      }
      moved.push_back(va);
      detail::sync_host_protection(s, va, m.size);
    }
    d.store.free(a.offset, a.size);
  }
  a.offset = 0;
  a.own_fd = fd;
  return true;
}

// The (st_dev, st_ino) of fd's file; false when fstat fails.
bool file_identity(int fd, std::pair<uint64_t, uint64_t>* id) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  *id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  return true;
}

// Gives a (just moved to its own memfd) the memory record its imports here will share.
bool give_memory_record(State& s, Allocation& a) {
  if (a.memory != nullptr) return true;
  std::pair<uint64_t, uint64_t> id;
  if (!file_identity(a.own_fd, &id)) return false;
  a.memory = std::make_shared<detail::MemoryRecord>();
  a.memory->device = a.device;
  a.memory->size = a.size;
  a.memory->file = id;
  s.exported[id] = a.memory;
  return true;
}

}  // namespace

// cuMemExportToShareableHandle. Checks, in order: a NULL output, flags other than 0, a handle
// value with no user reference left (released, never made) → INVALID_VALUE; a handle type that
// is not exactly one type requested at cuMemCreate → INVALID_VALUE (the driver's "invalid
// argument" when fabric was asked for on a device that cannot export it, pytorch PR #173606;
// the spec's recommended code for any type not requested). POSIX_FILE_DESCRIPTOR writes an int:
// a new fd the caller closes. Allowed during captures (not a stream operation).
CUresult sim_mem_export_to_shareable_handle(void* shareable, CUmemGenericAllocationHandle handle,
                                            CUmemAllocationHandleType type,
                                            unsigned long long flags) {
  return run(EntryPoint::mem_export_to_shareable_handle, true, [&](State& s, CallSize&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = detail::live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto t = static_cast<unsigned>(detail::bits(type));
    const auto requested = static_cast<unsigned>(detail::bits(a->prop.requestedHandleTypes));
    if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || (requested & t) == 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (!give_own_memfd(s, *a) || !give_memory_record(s, *a)) return CUDA_ERROR_OUT_OF_MEMORY;
    const int fd = fcntl(a->own_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;  // the process is out of file descriptors
    *static_cast<int*>(shareable) = fd;
    return CUDA_SUCCESS;
  });
}

// cuMemImportFromShareableHandle. The fd is passed by value cast to a pointer, and stays the
// caller's (the sim keeps a duplicate). Checks, in order: NULL output → INVALID_VALUE; fabric
// handles → NOT_SUPPORTED (no IMEX channel); any other type but POSIX_FILE_DESCRIPTOR →
// INVALID_VALUE; POSIX fds not supported by the devices (sim_posix_fd:false) → NOT_SUPPORTED;
// an fd that is not one the sim exported (closed, another file) or names a device this sim
// lacks → INVALID_VALUE [INF]. The new handle (never the exporter's value) has one user
// reference, to be released with cuMemRelease; its memory is counted by the exporter, not in
// this device's cuMemGetInfo, unless the exporter is this process: then the creator's handle
// and the imports share one record, counted until the last of them goes.
CUresult sim_mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle,
                                              void* os_handle, CUmemAllocationHandleType type) {
  return run(EntryPoint::mem_import_from_shareable_handle, true, [&](State& s, CallSize& units) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int t = detail::bits(type);
    if (t == CU_MEM_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_SUPPORTED;
    if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    if (!s.cfg.posix_fd) return CUDA_ERROR_NOT_SUPPORTED;
    const auto fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
    int dev = -1;
    size_t size = 0;
    if (!detail::handle_memfd_identity(fd, &dev, &size)) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev) || size == 0 || !aligned(size, s.cfg.granularity))
      return CUDA_ERROR_INVALID_VALUE;
    const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    auto a = std::make_unique<Allocation>();
    a->handle = detail::next_handle();
    a->device = dev;
    a->size = size;
    a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a->prop.location.id = dev;
    a->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    a->user_refs = 1;
    a->own_fd = own;
    a->imported = true;
    // Memory this process exported (and still holds): one record with the creator's handle, so
    // it stays counted until the last handle of it goes.
    std::pair<uint64_t, uint64_t> id;
    if (file_identity(own, &id)) {
      auto it = s.exported.find(id);
      if (it != s.exported.end()) a->memory = it->second.lock();
    }
    *handle = a->handle;
    s.allocations.emplace(a->handle, std::move(a));
    units = {size, 1, 1};
    return CUDA_SUCCESS;
  });
}

// cuMemGetAddressRange_v2: the bounds of the mapping (one handle's extent) that holds ptr, not
// of its reservation (libfabric PR #12473, UCX PR #11461; NCCL registers the range it answers).
// Both outputs are optional. A current context is needed (INVALID_CONTEXT, documented); an
// address in no mapping → NOT_FOUND (documented code).
CUresult sim_mem_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  return run(EntryPoint::mem_get_address_range, true, [&](State& s, CallSize&) {
    if (detail::current_device(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    auto it = detail::mapping_at(s, static_cast<uintptr_t>(ptr));
    if (it == s.mappings.end()) return CUDA_ERROR_NOT_FOUND;
    if (base != nullptr) *base = static_cast<CUdeviceptr>(it->first);
    if (size != nullptr) *size = it->second.size;
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
