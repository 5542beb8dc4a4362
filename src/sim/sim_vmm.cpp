// The sim's VMM entry points: reservations, physical allocations, mappings and access, with the
// codes cuda.h documents for misuse and the strict policies of sim::Policy where it is silent.
#include "sim/sim_call.hpp"
#include "sim/sim_entry.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace expanse::sim {
using detail::live_handle;
using detail::mapping_at;
using detail::maybe_free;
using detail::next_handle;
namespace {

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

// Whether [lo, lo + bytes) is host memory the driver has pinned, which the copy engine reads or
// writes directly (so a copy is stream-ordered work, not a staged one): inside one cuMemHostAlloc
// allocation or one cuMemHostRegister range, or mapped throughout to HOST_NUMA handles
// (cuMemCreate on a host node) that device d may access as `need` says.
bool pinned_host(State& s, uintptr_t lo, size_t bytes, int d, int need) {
  auto in_one = [&](const auto& ranges, auto size_of) {
    auto it = ranges.upper_bound(lo);
    if (it == ranges.begin()) return false;
    --it;
    const size_t n = size_of(it->second);
    return lo >= it->first && bytes <= n && lo - it->first <= n - bytes;
  };
  if (in_one(s.host_allocations, [](const detail::HostAllocation& h) { return h.size; })) return true;
  if (in_one(s.host_registered, [](size_t n) { return n; })) return true;
  const uintptr_t hi = lo + bytes;
  if (hi < lo || !accessible(s, lo, hi, d, need)) return false;
  for (auto it = mapping_at(s, lo); it != s.mappings.end() && it->first < hi; ++it) {
    if (it->second.alloc == nullptr || !it->second.alloc->host) return false;
  }
  return true;
}

enum class AsyncOp { htod, dtoh, memset };

// cuMemcpyHtoDAsync / cuMemcpyDtoHAsync / cuMemsetD8Async: a copy or memset put on a stream.
//
// Checks, in order: a current context (INVALID_CONTEXT); the stream (INVALID_HANDLE, or
// CONTEXT_IS_DESTROYED for one whose context was reset); a stream of another context
// (INVALID_HANDLE [INF]: the codes cuda.h lists are INVALID_CONTEXT/VALUE/HANDLE, and the sim
// already answers INVALID_HANDLE for cuEventRecord across contexts); then as the synchronous
// copies (check_copy): 0 bytes is a no-op (SUCCESS, nothing queued), a NULL host pointer and a
// device range not wholly mapped with the access the operation needs for the current context's
// device (READWRITE to write, READ to read) are INVALID_VALUE (the real driver may fault
// instead), and no host backing is NOT_SUPPORTED.
//
// When it runs (NVIDIA, CUDA Driver API, "API synchronization behavior"):
// - Pinned host memory (inside one cuMemHostAlloc allocation or cuMemHostRegister range, or
//   HOST_NUMA pages mapped with access for the device: pinned_host) and memset: stream-ordered. The
//   work runs when its stream's earlier work has completed: at once when nothing is pending,
//   otherwise when the hold is released or a synchronize (stream, event recorded after it,
//   context) completes it. Host bytes are read (HtoD) or written (DtoH) then, not at the call,
//   as a DMA engine would. cuMemFreeHost completes the pending work that touches the buffer
//   first (cudaFreeHost synchronizes).
// - Pageable host memory, HtoD: "the function will return once the pageable buffer has been
//   copied to the staging memory" — the source is read at the call (a snapshot) and lands in
//   device memory in stream order (NVIDIA/cccl#3814 saw exactly this: the staging copy happens
//   at once, not in stream order).
// - Pageable host memory, DtoH: "the function returns only once the copy has completed" (a
//   pageable destination blocks for the whole preceding kernel, measured on an RTX 4090,
//   lupinemachines/lupine#631): the stream's earlier work is completed, as cuStreamSynchronize
//   does, and the copy with it, before the call returns.
// The device range is checked again when the work runs: if it was unmapped, or lost the access
// the work needs, meanwhile (an illegal-address fault on a GPU), the work is skipped and counted
// in sim::async_faults().
//
// Capture: on a capturing stream the work is captured (a memcpy / memset node), never executed
// (pinned copies captured under torch.cuda.graph: pytorch/pytorch#146924; aws-ofi-nccl#1342
// moved its copies to cuMemcpyHtoDAsync on a side stream for capture). A pageable host buffer
// on a capturing stream is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the
// capture [INF, stricter than may be true: the staging above cannot be replayed]. On the legacy
// stream while a blocking stream of its context captures: IMPLICIT, as every legacy-stream
// work. On another stream during another capture: pinned copies and memsets are stream-ordered
// work like cuEventRecord, not "potentially unsafe"; a pageable one waits for (HtoD: may
// synchronize with) its stream from the host, so it is checked as unsafe, like
// cuStreamSynchronize (sim_capture.cpp).
CUresult async_op(State& s, CallSize& units, AsyncOp op, uintptr_t dev_ptr, uintptr_t host,
                  unsigned char value, size_t bytes, CUstream stream) {
  const int d = detail::current_device(s);
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* st = nullptr;
  if (const CUresult r = detail::work_stream_arg(s, stream, &st); r != CUDA_SUCCESS) return r;
  if (st->device != d) return CUDA_ERROR_INVALID_HANDLE;
  if (bytes == 0) return CUDA_SUCCESS;
  if (op != AsyncOp::memset && host == 0) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t hi = dev_ptr + bytes;
  if (hi < dev_ptr) return CUDA_ERROR_INVALID_VALUE;
  const int need =
      op == AsyncOp::dtoh ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!accessible(s, dev_ptr, hi, d, need)) return CUDA_ERROR_INVALID_VALUE;
  if (!s.cfg.backing) return CUDA_ERROR_NOT_SUPPORTED;
  const int host_need =
      op == AsyncOp::dtoh ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  const bool pageable = op != AsyncOp::memset && !pinned_host(s, host, bytes, d, host_need);
  if (pageable) {
    if (st->capture) {
      detail::invalidate(*st->capture);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
  }
  // The effect, run when the work item completes (the device range is checked again then).
  Stream::Effect effect;
  uintptr_t host_lo = 0;
  uintptr_t host_hi = 0;
  // Pinned host memory is checked again too: HOST_NUMA pages unmapped (or their access taken)
  // while the copy was pending fault as device pages do (cuMemFreeHost and cuMemHostUnregister
  // complete the work on their bytes first, so theirs are still there).
  const auto dev_ok = [dev_ptr, hi, d, need, pageable, host, bytes, host_need](State& now) {
    if (accessible(now, dev_ptr, hi, d, need) &&
        (pageable || host == 0 || pinned_host(now, host, bytes, d, host_need))) {
      return true;
    }
    ++now.async_faults;
    return false;
  };
  switch (op) {
    case AsyncOp::htod:
      if (pageable) {
        const auto* src = reinterpret_cast<const unsigned char*>(host);
        auto staged = std::make_shared<std::vector<unsigned char>>(src, src + bytes);
        effect = [dev_ok, dev_ptr, staged](State& now) {
          if (dev_ok(now))
            std::memcpy(reinterpret_cast<void*>(dev_ptr), staged->data(), staged->size());
        };
      } else {
        host_lo = host;
        host_hi = host + bytes;
        effect = [dev_ok, dev_ptr, host, bytes](State& now) {
          if (dev_ok(now))
            std::memcpy(reinterpret_cast<void*>(dev_ptr), reinterpret_cast<void*>(host), bytes);
        };
      }
      break;
    case AsyncOp::dtoh:
      host_lo = host;
      host_hi = host + bytes;
      effect = [dev_ok, dev_ptr, host, bytes](State& now) {
        if (dev_ok(now))
          std::memcpy(reinterpret_cast<void*>(host), reinterpret_cast<void*>(dev_ptr), bytes);
      };
      break;
    case AsyncOp::memset:
      effect = [dev_ok, dev_ptr, value, bytes](State& now) {
        if (dev_ok(now)) std::memset(reinterpret_cast<void*>(dev_ptr), value, bytes);
      };
      break;
  }
  uint64_t seq = 0;
  bool captured = false;
  const CUresult r =
      detail::submit_work(s, *st, std::move(effect), host_lo, host_hi, &seq, &captured);
  if (r != CUDA_SUCCESS) return r;
  if (!captured && pageable && op == AsyncOp::dtoh) {
    detail::force_complete(s, *st, seq);  // returns only once the copy has completed
    detail::progress(s);
  }
  units = {bytes, 1, 1};
  return CUDA_SUCCESS;
}

}  // namespace

// ---- physical allocations, shared with sim_share.cpp ----
namespace detail {
namespace {
std::atomic<uint64_t> g_handle_serial{0};
}  // namespace

// Handle values are never reused within a process, so a stale handle never aliases a new one.
CUmemGenericAllocationHandle next_handle() noexcept {
  const uint64_t n = g_handle_serial.fetch_add(1) + 1;
  return (uint64_t{0x51} << 40) | (n << 4);
}

Allocation::~Allocation() {
  if (own_fd >= 0) close(own_fd);
}

Allocation* live_handle(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.allocations.find(h);
  if (it == s.allocations.end() || it->second->user_refs == 0) return nullptr;
  return it->second.get();
}

void maybe_free(State& s, Allocation* a) {
  if (a->user_refs != 0 || a->map_refs != 0) return;
  if (a->memory != nullptr) {
    if (a->memory.use_count() == 1) {  // the last handle of it in this process
      device(s, a->memory->device).physical_used -= a->memory->size;
      s.exported.erase(a->memory->file);
    }
  } else if (a->host) {
    s.host_numa_used -= a->size;
    if (s.cfg.backing) s.host_stores[static_cast<size_t>(a->device)]->free(a->offset, a->size);
  } else if (!a->imported) {
    Device& d = device(s, a->device);
    d.physical_used -= a->size;
    if (s.cfg.backing && a->own_fd < 0) d.store.free(a->offset, a->size);
  }
  s.allocations.erase(a->handle);  // closes own_fd
}

std::map<uintptr_t, Mapping>::iterator mapping_at(State& s, uintptr_t va) {
  auto it = s.mappings.upper_bound(va);
  if (it == s.mappings.begin()) return s.mappings.end();
  --it;
  return va < it->first + it->second.size ? it : s.mappings.end();
}
}  // namespace detail

// ---- pinned host memory -------------------------------------------------------------------------
// cuMemHostAlloc / cuMemFreeHost. cuda.h documents SUCCESS, DEINITIALIZED, NOT_INITIALIZED,
// INVALID_CONTEXT, INVALID_VALUE (and OUT_OF_MEMORY for the allocation); the memory is
// page-locked host memory that every context may use (unified addressing), freed only with
// cuMemFreeHost. The sim's rules:
// - a current context is needed by both (INVALID_CONTEXT) [both document the code; the sim asks
//   for one even for the free, strict];
// - "potentially unsafe" during a capture (check_unsafe_call) [INF: cudaMallocHost/cudaFreeHost
//   are allocations outside stream order, like the documentation's cudaMalloc example, and
//   cudaFreeHost synchronizes];
// - pp NULL, Flags outside CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED, and bytesize 0
//   are INVALID_VALUE [INF for 0: cuda.h is silent for cuMemHostAlloc and documents
//   INVALID_VALUE for cuMemAlloc(0); the runtime's cudaHostAlloc(0) succeeds without setting the
//   pointer (ComputationalRadiationPhysics/picongpu#1179), which need not reach the driver];
// - more than sim_host_capacity in all (HOST_NUMA handles included) is OUT_OF_MEMORY (a host
//   that cannot lock more pages);
// - the memory is an anonymous host mapping, page-aligned, zero-filled;
// - cuMemFreeHost of anything but a pointer cuMemHostAlloc returned (NULL, an interior pointer,
//   one already freed, malloc'd memory) is INVALID_VALUE; it first completes the pending async
//   copies that touch the buffer (cudaFreeHost synchronizes), so none runs on freed memory.

CUresult sim_mem_host_alloc(void** pp, size_t bytes, unsigned int flags) {
  return run(EntryPoint::mem_host_alloc, true, [&](State& s, CallSize& units) {
    if (detail::current_device(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    constexpr unsigned kKnown =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    // HOST_NUMA handles and registered ranges lock pages too.
    const size_t pinned = s.host_used + s.host_numa_used + s.host_registered_used;
    if (bytes > s.cfg.host_capacity - std::min(s.cfg.host_capacity, pinned))
      return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t hp = detail::host_page_size();
    if (bytes > SIZE_MAX - hp) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t mapped = (bytes + hp - 1) / hp * hp;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    detail::HostAllocation& h = s.host_allocations[reinterpret_cast<uintptr_t>(p)];
    h.size = bytes;
    h.mapped = mapped;
    h.flags = flags;
    s.host_used += bytes;
    *pp = p;
    units = {bytes, 1, 1};
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_free_host(void* p) {
  return run(EntryPoint::mem_free_host, true, [&](State& s, CallSize& units) {
    if (detail::current_device(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    const auto base = reinterpret_cast<uintptr_t>(p);
    auto it = s.host_allocations.find(base);
    if (it == s.host_allocations.end()) return CUDA_ERROR_INVALID_VALUE;
    const detail::HostAllocation h = it->second;
    detail::complete_host_range(s, base, base + h.size);
    munmap(p, h.mapped);
    s.host_allocations.erase(base);
    s.host_used -= h.size;
    units = {h.size, 1, 1};
    return CUDA_SUCCESS;
  });
}

// ---- registered host memory -----------------------------------------------------------------------
// cuMemHostRegister / cuMemHostUnregister (cuda.h documents SUCCESS, DEINITIALIZED,
// NOT_INITIALIZED, INVALID_CONTEXT, INVALID_VALUE, OUT_OF_MEMORY, HOST_MEMORY_ALREADY_REGISTERED,
// NOT_PERMITTED, NOT_SUPPORTED; and HOST_MEMORY_NOT_REGISTERED for the unregister). The sim's rules:
// - a current context, and "potentially unsafe" during a capture, as cuMemHostAlloc [INF];
// - p NULL, bytesize 0, flags outside PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY: INVALID_VALUE;
// - a range overlapping one registered already, or cuMemHostAlloc memory: ALREADY_REGISTERED [DOC];
// - more than sim_host_capacity pinned in all: OUT_OF_MEMORY;
// - unregister takes the base a register was given (anything else: NOT_REGISTERED [DOC]) and,
//   like cuMemFreeHost, first completes the pending async copies that touch the range [INF].

CUresult sim_mem_host_register(void* p, size_t bytes, unsigned int flags) {
  return run(EntryPoint::mem_host_register, true, [&](State& s, CallSize& units) {
    if (detail::current_device(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
    if (p == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto lo = reinterpret_cast<uintptr_t>(p);
    if (bytes > UINTPTR_MAX - lo) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t hi = lo + bytes;
    auto overlaps = [&](const auto& ranges, auto size_of) {
      auto it = ranges.upper_bound(lo);
      if (it != ranges.end() && it->first < hi) return true;
      if (it != ranges.begin()) {
        --it;
        if (it->first + size_of(it->second) > lo) return true;
      }
      return false;
    };
    if (overlaps(s.host_registered, [](size_t n) { return n; }) ||
        overlaps(s.host_allocations, [](const detail::HostAllocation& h) { return h.mapped; }) ||
        s.host_registered.count(lo) != 0 || s.host_allocations.count(lo) != 0) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    const size_t pinned = s.host_used + s.host_numa_used + s.host_registered_used;
    if (bytes > s.cfg.host_capacity - std::min(s.cfg.host_capacity, pinned)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s.host_registered.emplace(lo, bytes);
    s.host_registered_used += bytes;
    units = {bytes, 1, 1};
    return CUDA_SUCCESS;
  });
}

CUresult sim_mem_host_unregister(void* p) {
  return run(EntryPoint::mem_host_unregister, true, [&](State& s, CallSize& units) {
    if (detail::current_device(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult c = detail::check_unsafe_call(s); c != CUDA_SUCCESS) return c;
    const auto lo = reinterpret_cast<uintptr_t>(p);
    auto it = s.host_registered.find(lo);
    if (it == s.host_registered.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    const size_t bytes = it->second;
    detail::complete_host_range(s, lo, lo + bytes);
    s.host_registered.erase(it);
    s.host_registered_used -= bytes;
    units = {bytes, 1, 1};
    return CUDA_SUCCESS;
  });
}

// ---- asynchronous copies and memset (async_op above) ---------------------------------------------

CUresult sim_memcpy_htod_async(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  return run(EntryPoint::memcpy_htod_async, true, [&](State& s, CallSize& units) {
    return async_op(s, units, AsyncOp::htod, static_cast<uintptr_t>(dst),
                    reinterpret_cast<uintptr_t>(src), 0, bytes, stream);
  });
}

CUresult sim_memcpy_dtoh_async(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return run(EntryPoint::memcpy_dtoh_async, true, [&](State& s, CallSize& units) {
    return async_op(s, units, AsyncOp::dtoh, static_cast<uintptr_t>(src),
                    reinterpret_cast<uintptr_t>(dst), 0, bytes, stream);
  });
}

CUresult sim_memset_d8_async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  return run(EntryPoint::memset_d8_async, true, [&](State& s, CallSize& units) {
    return async_op(s, units, AsyncOp::memset, static_cast<uintptr_t>(dst), 0, value, n, stream);
  });
}

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

namespace {

// cuMemCreate on a host NUMA node (the checks common to every location done): host pages from the
// node's memfd, counted against sim_host_capacity with cuMemHostAlloc's, apart from any device's.
// The sim exports no host handle: a requested handle type is NOT_SUPPORTED (a GPU's driver
// can export them where attribute 143 says so).
CUresult create_host_numa(State& s, CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned handle_types, CallSize& units) {
  if (!aligned(size, s.cfg.granularity)) return CUDA_ERROR_INVALID_VALUE;
  if (handle_types != 0 || prop->allocFlags.gpuDirectRDMACapable != 0 || prop->allocFlags.usage != 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  const size_t used = s.host_used + s.host_numa_used + s.host_registered_used;
  if (size > s.cfg.host_capacity - std::min(s.cfg.host_capacity, used)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const int node = prop->location.id;
  uint64_t offset = 0;
  if (s.cfg.backing) {
    if (s.host_stores.size() < static_cast<size_t>(s.cfg.numa_nodes)) {
      s.host_stores.resize(static_cast<size_t>(s.cfg.numa_nodes));
    }
    auto& store = s.host_stores[static_cast<size_t>(node)];
    if (store == nullptr) store = std::make_unique<detail::PhysicalStore>();
    if (!store->ensure_open("expanse-sim-host-node-" + std::to_string(node), size, nullptr) ||
        !store->allocate(size, &offset)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  auto a = std::make_unique<Allocation>();
  a->handle = next_handle();
  a->device = node;
  a->host = true;
  a->size = size;
  a->prop = *prop;
  a->prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(0);
  a->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
  a->user_refs = 1;
  a->offset = offset;
  s.host_numa_used += size;
  *handle = a->handle;
  s.allocations.emplace(a->handle, std::move(a));
  units = {size, 1, 1};
  return CUDA_SUCCESS;
}

}  // namespace

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
        // A real node (0 without NUMA); -1 is INVALID_VALUE (cuda-python#2694), as is a node the
        // host does not have [INF]. Without attribute 141 the driver cannot [DOC].
        if (prop->location.id < 0 || prop->location.id >= s.cfg.numa_nodes) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        if (!s.cfg.host_numa) return CUDA_ERROR_NOT_SUPPORTED;
        return create_host_numa(s, handle, size, prop, handle_types, units);
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
    // Allowed during a capture (measured: H200, driver 580.159.04, from the capturing thread of a
    // GLOBAL capture); the capture stays valid, and other threads and modes are as for
    // cuMemCreate [INF].
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
    const bool own = a->own_fd >= 0;
    if (s.cfg.backing &&
        !detail::va_map_file(lo, size,
                             own      ? a->own_fd
                             : a->host ? s.host_stores[static_cast<size_t>(a->device)]->fd()
                                       : device(s, a->device).store.fd(),
                             own ? 0 : a->offset)) {
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
      // HOST/HOST_NUMA access is for host memory only (checked below, per mapping: on device
      // memory NOT_SUPPORTED, measured on H100, driver 580.159.04, 2026-11-23); other location
      // types and a bad device ordinal INVALID_VALUE (measured there too). A HOST_NUMA
      // descriptor's id is ignored [DOC].
      const int lt = detail::bits(d.location.type);
      if (lt == CU_MEM_LOCATION_TYPE_HOST || lt == CU_MEM_LOCATION_TYPE_HOST_NUMA) continue;
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
    auto is_host_desc = [](const CUmemAccessDesc& d) {
      const int lt = detail::bits(d.location.type);
      return lt == CU_MEM_LOCATION_TYPE_HOST || lt == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    };
    for (auto it : ms) {
      for (size_t i = 0; i < count; ++i) {
        if (is_host_desc(desc[i]) && !it->second.alloc->host) return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
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
        if (it->second.alloc->host) continue;  // every device reaches pinned host memory
        for (size_t i = 0; i < count; ++i) {
          if (is_host_desc(desc[i])) continue;
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
        for (size_t i = 0; i < count; ++i) {
          if (is_host_desc(desc[i])) {
            run_it->second.host = detail::bits(desc[i].flags);
          } else {
            run_it->second.set(desc[i].location.id, detail::bits(desc[i].flags));
          }
        }
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
    const int lt = detail::bits(location->type);
    const bool host = lt == CU_MEM_LOCATION_TYPE_HOST || lt == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    if (!host && lt != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!host && !valid_device(s, location->id)) return CUDA_ERROR_INVALID_DEVICE;
    const auto va = static_cast<uintptr_t>(ptr);
    auto it = mapping_at(s, va);
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    if (host && !it->second.alloc->host) return CUDA_ERROR_INVALID_VALUE;  // device memory [INF]
    auto run_it = it->second.access.upper_bound(va - it->first);
    --run_it;
    *flags = static_cast<unsigned long long>(host ? run_it->second.host
                                                  : run_it->second.flags_of(location->id));
    return CUDA_SUCCESS;
  });
}

}  // namespace expanse::sim
