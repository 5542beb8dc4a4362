// The sim's VMM entry points: reservations, physical allocations, mappings and access, with the
// codes cuda.h documents for misuse and the strict policies of sim::Policy where it is silent.
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

namespace expanse::sim {
namespace {

std::atomic<uint64_t> g_handle_serial{0};

// Handle values are never reused within a process, so a stale handle never aliases a new one.
CUmemGenericAllocationHandle next_handle() noexcept {
  const uint64_t n = g_handle_serial.fetch_add(1) + 1;
  return (uint64_t{0x51} << 40) | (n << 4);
}

// ---- VMM helpers --------------------------------------------------------------------------------

Allocation* live_handle(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.allocations.find(h);
  if (it == s.allocations.end() || it->second->user_refs == 0) return nullptr;
  return it->second.get();
}

// Frees the physical memory once nothing refers to it any more.
void maybe_free(State& s, Allocation* a) {
  if (a->user_refs != 0 || a->map_refs != 0) return;
  Device& d = device(s, a->device);
  d.physical_used -= a->size;
  if (s.cfg.backing) d.store.free(a->offset, a->size);
  s.allocations.erase(a->handle);
}

// The mapping containing va, or end().
std::map<uintptr_t, Mapping>::iterator mapping_at(State& s, uintptr_t va) {
  auto it = s.mappings.upper_bound(va);
  if (it == s.mappings.begin()) return s.mappings.end();
  --it;
  return va < it->first + it->second.size ? it : s.mappings.end();
}

// [lo, hi) inside one reservation (or, if allow_span, inside adjacent reservations).
bool inside_reservations(const State& s, uintptr_t lo, uintptr_t hi, bool allow_span) {
  auto it = s.reservations.upper_bound(lo);
  if (it == s.reservations.begin()) return false;
  --it;
  uintptr_t end = it->first + it->second.size;
  if (lo >= end) return false;
  while (hi > end) {
    if (!allow_span) return false;
    ++it;
    if (it == s.reservations.end() || it->first != end) return false;
    end = it->first + it->second.size;
  }
  return true;
}

bool overlaps_mapping(const State& s, uintptr_t lo, uintptr_t hi) {
  auto it = s.mappings.lower_bound(lo);
  if (it != s.mappings.end() && it->first < hi) return true;
  if (it != s.mappings.begin()) {
    --it;
    if (it->first + it->second.size > lo) return true;
  }
  return false;
}

// The mappings wholly inside [lo, hi) into *out (ascending; holes between them allowed); false if
// a mapping lies only partly inside.
bool mappings_inside(State& s, uintptr_t lo, uintptr_t hi,
                     std::vector<std::map<uintptr_t, Mapping>::iterator>* out) {
  auto it = s.mappings.lower_bound(lo);
  if (it != s.mappings.begin() && std::prev(it)->first + std::prev(it)->second.size > lo) {
    return false;  // one starts before lo and reaches into the range
  }
  for (; it != s.mappings.end() && it->first < hi; ++it) {
    if (it->first + it->second.size > hi) return false;
    out->push_back(it);
  }
  return true;
}

// Removes whole mappings ms (ascending, already validated): host VA back to reserved, one call per
// run of adjacent mappings (the range asked for may hold holes), references dropped.
CUresult unmap_range(State& s, const std::vector<std::map<uintptr_t, Mapping>::iterator>& ms) {
  for (size_t i = 0; s.cfg.backing && i < ms.size();) {
    const uintptr_t run_lo = ms[i]->first;
    uintptr_t run_hi = run_lo + ms[i]->second.size;
    for (++i; i < ms.size() && ms[i]->first == run_hi; ++i) run_hi += ms[i]->second.size;
    if (!detail::va_unmap_to_reserved(run_lo, run_hi - run_lo)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (auto it : ms) {
    Allocation* a = it->second.alloc;
    s.mapped_bytes -= it->second.size;
    s.mappings.erase(it);
    --a->map_refs;
    maybe_free(s, a);
  }
  return CUDA_SUCCESS;
}

void split_run(Mapping& m, size_t off) {
  if (off >= m.size) return;
  auto it = m.access.upper_bound(off);
  --it;  // the run containing off (key 0 always exists)
  if (it->first != off) m.access.emplace_hint(std::next(it), off, it->second);
}

void merge_runs(Mapping& m) {
  auto it = m.access.begin();
  while (it != m.access.end()) {
    auto next = std::next(it);
    if (next != m.access.end() && next->second == it->second) {
      m.access.erase(next);
    } else {
      it = next;
    }
  }
}

// Whether [lo, hi) lies in adjacent mappings whose access for device dev is at least `need`
// (CU_MEM_ACCESS_FLAGS_PROT_READ or _READWRITE) throughout.
bool accessible(State& s, uintptr_t lo, uintptr_t hi, int dev, int need) {
  auto it = mapping_at(s, lo);
  if (it == s.mappings.end()) return false;
  uintptr_t cur = lo;
  while (cur < hi) {
    if (it == s.mappings.end() || cur < it->first || cur >= it->first + it->second.size) {
      return false;  // a gap before the next mapping
    }
    const Mapping& m = it->second;
    const size_t off_hi = std::min(hi, it->first + m.size) - it->first;
    auto run_it = m.access.upper_bound(cur - it->first);
    --run_it;  // the run containing cur (key 0 always exists)
    for (; run_it != m.access.end() && run_it->first < off_hi; ++run_it) {
      if ((run_it->second.flags_of(dev) & need) != need) return false;
    }
    cur = it->first + m.size;
    ++it;
  }
  return true;
}

// cuMemcpyHtoD / cuMemcpyDtoH (inferred: cuda.h documents the signatures and that the copy is
// synchronous for pageable memory, not the codes of misuse). Checks, in order: a current
// context (INVALID_CONTEXT), ByteCount 0 is a no-op (SUCCESS), a NULL host pointer
// (INVALID_VALUE), the device range wholly in mappings the current context's device may read
// (DtoH) or read and write (HtoD), possibly spanning adjacent mappings (else INVALID_VALUE; the
// real driver may report some of these, an unmapped or inaccessible range, as
// CUDA_ERROR_ILLEGAL_ADDRESS or fault asynchronously, so the sim's code is a strict policy), and
// host memory behind the pages (sim_backing; else NOT_SUPPORTED: nothing to copy from). The copy
// completes before the call returns; it does not wait on (or order against) any stream's pending
// work — the sim has no device-side writers for it to wait for.
//
// Capture: a synchronous copy is ordered with the legacy stream, so while a blocking stream of the
// context captures it is an implicit dependency on the capture (IMPLICIT, invalidating it; the
// aws-ofi-nccl PR #1342 failure); otherwise it is a "potentially unsafe" call (sim_capture.cpp).
CUresult check_copy(State& s, uintptr_t dev_ptr, const void* host, size_t bytes, int need) {
  const int d = detail::current_device(s);
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (detail::blocking_capture_in(s, d)) {
    detail::invalidate_blocking_captures(s, d);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
  if (bytes == 0) return CUDA_SUCCESS;
  if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t hi = dev_ptr + bytes;
  if (hi < dev_ptr) return CUDA_ERROR_INVALID_VALUE;
  if (!accessible(s, dev_ptr, hi, d, need)) return CUDA_ERROR_INVALID_VALUE;
  if (!s.cfg.backing) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

}  // namespace

// ---- copies -------------------------------------------------------------------------------------
// The host protection of a mapping is the union of every device's access (so at least the current
// device's): once check_copy passed, the host mapping allows the copy.

CUresult sim_memcpy_htod(CUdeviceptr dst, const void* src, size_t bytes) {
  return run(EntryPoint::memcpy_htod, true, [&](State& s, CallSize&) {
    const auto va = static_cast<uintptr_t>(dst);
    const CUresult r = check_copy(s, va, src, bytes, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (r == CUDA_SUCCESS && bytes != 0) std::memcpy(reinterpret_cast<void*>(va), src, bytes);
    return r;
  });
}

CUresult sim_memcpy_dtoh(void* dst, CUdeviceptr src, size_t bytes) {
  return run(EntryPoint::memcpy_dtoh, true, [&](State& s, CallSize&) {
    const auto va = static_cast<uintptr_t>(src);
    const CUresult r = check_copy(s, va, dst, bytes, CU_MEM_ACCESS_FLAGS_PROT_READ);
    if (r == CUDA_SUCCESS && bytes != 0) {
      std::memcpy(dst, reinterpret_cast<const void*>(va), bytes);
    }
    return r;
  });
}

// ---- VMM: address space -------------------------------------------------------------------------

CUresult sim_mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags) {
  return run(EntryPoint::mem_address_reserve, true, [&](State& s, CallSize&) {
    // Allowed during any capture, from any thread and mode (measured: H100, driver 580).
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const size_t hp = detail::host_page_size();
    if (ptr == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!aligned(size, hp) || !aligned(addr, hp)) return CUDA_ERROR_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    const size_t align = std::max(alignment, s.cfg.granularity);
    const uintptr_t base = detail::va_reserve(size, align, static_cast<uintptr_t>(addr));
    if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    s.reservations[base].size = size;
    *ptr = static_cast<CUdeviceptr>(base);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_address_free(CUdeviceptr ptr, size_t size) {
  return run(EntryPoint::mem_address_free, true, [&](State& s, CallSize&) {
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const auto base = static_cast<uintptr_t>(ptr);
    auto it = s.reservations.find(base);
    if (it == s.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t end = base + size;
    if (overlaps_mapping(s, base, end)) {
      if (s.policy.free_with_mappings_is_error) return CUDA_ERROR_INVALID_VALUE;
      // Lenient: unmap what is left, one whole mapping at a time (one that starts in the previous
      // reservation, mapped across with the lenient map policy, included).
      auto first = mapping_at(s, base);
      if (first == s.mappings.end()) first = s.mappings.lower_bound(base);
      for (auto m = first; m != s.mappings.end() && m->first < end;) {
        auto next = std::next(m);
        const CUresult r = unmap_range(s, {m});
        if (r != CUDA_SUCCESS) return r;
        m = next;
      }
    }
    detail::va_release(base, size);
    s.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

// ---- VMM: physical memory -----------------------------------------------------------------------

CUresult sim_mem_create(CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags) {
  return run(EntryPoint::mem_create, true, [&](State& s, CallSize& units) {
    // Allowed during any capture, from any thread and mode (measured: H100, driver 580).
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr || prop == nullptr || flags != 0 || size == 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (detail::bits(prop->type) != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned kKnownHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                           CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                           CU_MEM_HANDLE_TYPE_FABRIC;
    // Bits outside the known handle types are ignored, and dropped from the properties the handle
    // reports (0x100 -> SUCCESS, reported as 0; measured on H100, driver 580.159.04, 2026-11-23).
    const auto handle_types =
        static_cast<unsigned>(detail::bits(prop->requestedHandleTypes)) & kKnownHandleTypes;
    if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto& af = prop->allocFlags;
    if (af.compressionType > CU_MEM_ALLOCATION_COMP_GENERIC) return CUDA_ERROR_INVALID_VALUE;
    if ((af.usage & ~(CU_MEM_CREATE_USAGE_TILE_POOL | CU_MEM_CREATE_USAGE_HW_DECOMPRESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned char r : af.reserved) {
      if (r != 0) return CUDA_ERROR_INVALID_VALUE;
    }
    switch (detail::bits(prop->location.type)) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!valid_device(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        break;
      case CU_MEM_LOCATION_TYPE_HOST:
        // Not IPC-capable: any handle type is invalid; host VMM itself is not supported (attr 145).
        return handle_types != 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        return prop->location.id < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
      default:  // INVALID, HOST_NUMA_CURRENT, anything else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!aligned(size, s.cfg.granularity)) return CUDA_ERROR_INVALID_VALUE;
    // What the device does not support (NOT_SUPPORTED, a documented code of cuMemCreate):
    // POSIX file descriptors unless sim_posix_fd (attr 103), RDMA unless sim_rdma
    // (attr 110); Windows handles, fabric handles (attrs 104/105/128), tile pools and hardware
    // decompression never.
    const unsigned supported =
        s.cfg.posix_fd ? static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) : 0u;
    if ((handle_types & ~supported) != 0 || (af.gpuDirectRDMACapable != 0 && !s.cfg.rdma) ||
        af.usage != 0) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const int dev = prop->location.id;
    Device& d = device(s, dev);
    if (size > s.cfg.capacity - d.physical_used) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t offset = 0;
    if (s.cfg.backing) {
      if (!d.store.ensure_open("expanse-sim-device-" + std::to_string(dev), s.cfg.capacity,
                               nullptr) ||
          !d.store.allocate(size, &offset)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    auto a = std::make_unique<Allocation>();
    a->handle = next_handle();
    a->device = dev;
    a->size = size;
    a->prop = *prop;
    a->prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(handle_types);
    a->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;  // attr 107 is 0
    a->user_refs = 1;
    a->offset = offset;
    d.physical_used += size;
    *handle = a->handle;
    s.allocations.emplace(a->handle, std::move(a));
    units = {size, 1, 1};
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_release(CUmemGenericAllocationHandle handle) {
  return run(EntryPoint::mem_release, true, [&](State& s, CallSize&) {
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    --a->user_refs;
    maybe_free(s, a);
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_allocation_granularity(size_t* granularity, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags option) {
  return run(EntryPoint::mem_get_allocation_granularity, true, [&](State& s, CallSize&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int opt = detail::bits(option);
    if (opt != CU_MEM_ALLOC_GRANULARITY_MINIMUM && opt != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The properties themselves are not looked at: a bad type, location type or device ordinal
    // still gets the granularity (measured on H100, driver 580.159.04, 2026-11-23).
    *granularity = s.cfg.granularity;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_allocation_properties_from_handle(CUmemAllocationProp* prop,
                                                       CUmemGenericAllocationHandle handle) {
  return run(EntryPoint::mem_get_allocation_properties_from_handle, true, [&](State& s, CallSize&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *prop = a->prop;
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  return run(EntryPoint::mem_retain_allocation_handle, true, [&](State& s, CallSize&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = mapping_at(s, reinterpret_cast<uintptr_t>(addr));
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = it->second.alloc;
    ++a->user_refs;  // the handle value is valid again if its references had all gone
    *handle = a->handle;
    return CUDA_SUCCESS;
  });
}

// ---- VMM: mappings ------------------------------------------------------------------------------

CUresult sim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return run(EntryPoint::mem_map, true, [&](State& s, CallSize& units) {
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    Allocation* a = live_handle(s, handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Only a whole handle maps: a non-zero offset or a size other than the handle's (unaligned,
    // smaller, larger) is NOT_SUPPORTED, asked before the address is looked at (measured on H100,
    // driver 580.159.04, 2026-11-23).
    if (offset != 0 || size != a->size) return CUDA_ERROR_NOT_SUPPORTED;
    const auto lo = static_cast<uintptr_t>(ptr);
    if (!aligned(lo, s.cfg.granularity)) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t hi = lo + size;
    if (hi < lo) return CUDA_ERROR_INVALID_VALUE;
    if (!inside_reservations(s, lo, hi, !s.policy.map_across_reservations_is_error)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (overlaps_mapping(s, lo, hi)) return CUDA_ERROR_INVALID_VALUE;
    if (s.cfg.backing &&
        !detail::va_map_file(lo, size, device(s, a->device).store.fd(), a->offset)) {
      return CUDA_ERROR_OUT_OF_MEMORY;  // the host ran out of mappings (vm.max_map_count)
    }
    Mapping& m = s.mappings[lo];
    m.size = size;
    m.alloc = a;
    m.access.emplace(0, AccessBits{});
    ++a->map_refs;
    s.mapped_bytes += size;
    units = {size, 1, 1};
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_unmap(CUdeviceptr ptr, size_t size) {
  return run(EntryPoint::mem_unmap, true, [&](State& s, CallSize& units) {
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    const auto lo = static_cast<uintptr_t>(ptr);
    const uintptr_t hi = lo + size;
    if (size == 0 || hi < lo) return CUDA_ERROR_INVALID_VALUE;
    // The start must lie in a reservation; then every mapping wholly inside the range is unmapped
    // and holes (even the whole range) are skipped: SUCCESS. Only a mapping cut by either end
    // fails the call, with nothing unmapped (measured on H100, driver 580.159.04, 2026-11-23).
    if (!inside_reservations(s, lo, lo + 1, false)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::map<uintptr_t, Mapping>::iterator> ms;
    if (!mappings_inside(s, lo, hi, &ms)) return CUDA_ERROR_INVALID_VALUE;
    const CUresult r = unmap_range(s, ms);
    if (r == CUDA_SUCCESS) units = {size, ms.size(), 1};
    return r;
  });
}

CUresult sim_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                            size_t count) {
  return run(EntryPoint::mem_set_access, true, [&](State& s, CallSize& units) {
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = desc[i];
      const int f = detail::bits(d.flags);
      if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      // All sim allocations are device memory: HOST/HOST_NUMA access to it is NOT_SUPPORTED, other
      // location types and a bad device ordinal INVALID_VALUE (measured on H100, driver
      // 580.159.04, 2026-11-23).
      const int lt = detail::bits(d.location.type);
      if (lt == CU_MEM_LOCATION_TYPE_HOST || lt == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return CUDA_ERROR_NOT_SUPPORTED;
      if (lt != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (!valid_device(s, d.location.id)) return CUDA_ERROR_INVALID_VALUE;
    }
    const auto lo = static_cast<uintptr_t>(ptr);
    const uintptr_t hi = lo + size;
    if (size == 0 || hi < lo) return CUDA_ERROR_INVALID_VALUE;
    if (!aligned(lo, s.cfg.granularity) || !aligned(size, s.cfg.granularity))
      return CUDA_ERROR_INVALID_VALUE;
    // The range must begin where a mapping begins and end where one ends (part of a mapping:
    // INVALID_VALUE). Access is then given to the adjacent mappings from lo up to the first hole
    // and the call succeeds; mappings past a hole keep theirs (measured on H100, driver
    // 580.159.04, 2026-11-23).
    const auto first = s.mappings.find(lo);
    const auto last = mapping_at(s, hi - 1);
    if (first == s.mappings.end() || last == s.mappings.end() ||
        last->first + last->second.size != hi) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::vector<std::map<uintptr_t, Mapping>::iterator> ms;
    uintptr_t cur = lo;
    for (auto it = first; cur < hi && it != s.mappings.end() && it->first == cur; ++it) {
      ms.push_back(it);
      cur += it->second.size;
    }
    const uintptr_t run_hi = cur;  // end of the run that gets the access
    // sim_rdma:wsl: WSL2 accepts gpuDirectRDMACapable at cuMemCreate/cuMemMap and fails here,
    // with the generic code, for every mapping of such memory (pytorch/pytorch#192330).
    if (s.cfg.rdma_wsl) {
      for (auto it : ms) {
        if (it->second.alloc->prop.allocFlags.gpuDirectRDMACapable != 0) return CUDA_ERROR_UNKNOWN;
      }
    }
    // A device other than the owner needs a peer path (cuDeviceCanAccessPeer; sim_peer_access).
    // The real code for a device without one is undocumented; cuda-api-wrappers#512 reports
    // "invalid argument" from this call on a multi-GPU box without P2P.
    if (!s.cfg.peer_access) {
      for (auto it : ms) {
        for (size_t i = 0; i < count; ++i) {
          if (desc[i].location.id != it->second.alloc->device &&
              detail::bits(desc[i].flags) != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
            return CUDA_ERROR_INVALID_VALUE;
          }
        }
      }
    }
    std::vector<std::map<size_t, AccessBits>> saved;
    saved.reserve(ms.size());
    for (auto it : ms) {
      Mapping& m = it->second;
      saved.push_back(m.access);
      const size_t off_lo = std::max(lo, it->first) - it->first;
      const size_t off_hi = std::min(hi, it->first + m.size) - it->first;
      split_run(m, off_lo);
      split_run(m, off_hi);
      for (auto run_it = m.access.find(off_lo); run_it != m.access.end() && run_it->first < off_hi;
           ++run_it) {
        for (size_t i = 0; i < count; ++i)
          run_it->second.set(desc[i].location.id, detail::bits(desc[i].flags));
      }
      merge_runs(m);
    }
    if (!detail::sync_host_protection(s, lo, run_hi - lo)) {
      for (size_t i = 0; i < ms.size(); ++i) ms[i]->second.access = std::move(saved[i]);
      detail::sync_host_protection(s, lo, run_hi - lo);
      return CUDA_ERROR_OUT_OF_MEMORY;  // the host ran out of mappings (vm.max_map_count)
    }
    units = {size, ms.size(), static_cast<double>(count)};
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_get_access(unsigned long long* flags, const CUmemLocation* location,
                            CUdeviceptr ptr) {
  return run(EntryPoint::mem_get_access, true, [&](State& s, CallSize&) {
    if (!vmm_context_ok(s)) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (detail::bits(location->type) != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, location->id)) return CUDA_ERROR_INVALID_DEVICE;
    const auto va = static_cast<uintptr_t>(ptr);
    auto it = mapping_at(s, va);
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    auto run_it = it->second.access.upper_bound(va - it->first);
    --run_it;
    *flags = static_cast<unsigned long long>(run_it->second.flags_of(location->id));
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
