// The rules expanse relies on, each checked at run time on the driver in use (each is documented
// in cuda.h's Virtual Memory Management section or was observed on a real driver). Only that
// behaviour is checked, and no check provokes a sticky error (no access to unmapped memory), so
// a failed check never poisons the ones after it.
#include "selftest_checks.hpp"

#include "conf/env_config.hpp"

#include <cstring>
#include <memory>
#include <vector>

namespace expanse::tools::selftest {
namespace {

using conf::format_size;

uint64_t word(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 29);
}

void put(const Env& e, CUdeviceptr p, uint64_t v) {
  e.ok(e.t.memcpy_htod(p, &v, sizeof v), "cuMemcpyHtoD");
}

uint64_t get(const Env& e, CUdeviceptr p) {
  uint64_t v = 0;
  e.ok(e.t.memcpy_dtoh(&v, p, sizeof v), "cuMemcpyDtoH");
  return v;
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// Writes a word at the head and the tail of each of `pages` granularity pages from base.
void write_pages(const Env& e, CUdeviceptr base, size_t pages, uint64_t seed) {
  const size_t g = e.granularity;
  for (size_t i = 0; i < pages; ++i) {
    put(e, base + i * g, word(seed, 2 * i));
    put(e, base + (i + 1) * g - 8, word(seed, 2 * i + 1));
  }
}

void verify_pages(const Env& e, CUdeviceptr base, size_t pages, uint64_t seed,
                  const std::string& what) {
  const size_t g = e.granularity;
  for (size_t i = 0; i < pages; ++i) {
    for (int k = 0; k < 2; ++k) {
      const CUdeviceptr p = k == 0 ? base + i * g : base + (i + 1) * g - 8;
      const uint64_t want = word(seed, 2 * i + static_cast<uint64_t>(k));
      const uint64_t got = get(e, p);
      Env::require(got == want, what + ": page " + std::to_string(i) + (k == 0 ? " head" : " tail") +
                                    " reads " + hex(got) + ", wrote " + hex(want));
    }
  }
}

std::string vmm_supported(const Env& e) {
  int v = 0;
  e.ok(e.t.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, e.dev),
       "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  Env::require(v == 1, "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is " +
                           std::to_string(v) + ": expanse needs the VMM API");
  return "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 1";
}

std::string granularity(const Env& e) {
  const size_t g = e.granularity;
  Env::require(g >= 4096 && (g & (g - 1)) == 0,
               "minimum granularity " + std::to_string(g) + " is not a power of two >= 4 KiB");
  size_t rec = 0;
  const CUmemAllocationProp p = e.prop();
  e.ok(e.t.mem_get_allocation_granularity(&rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
       "cuMemGetAllocationGranularity(RECOMMENDED)");
  Env::require(rec >= g && rec % g == 0, "recommended granularity " + format_size(rec) +
                                             " is not a multiple of the minimum " + format_size(g));
  return "minimum " + format_size(g) + ", recommended " + format_size(rec);
}

std::string create_rejects_unaligned_size(const Env& e) {
  const size_t bad = e.granularity + e.granularity / 2;
  const CUmemAllocationProp p = e.prop();
  CUmemGenericAllocationHandle h{};
  const CUresult r = e.t.mem_create(&h, bad, &p, 0);
  if (r == CUDA_SUCCESS) e.t.mem_release(h);
  e.expect_code(r, CUDA_ERROR_INVALID_VALUE,
                "cuMemCreate(" + format_size(bad) + ", not a multiple of the granularity)");
  return "cuMemCreate(" + format_size(bad) + ") -> CUDA_ERROR_INVALID_VALUE";
}

std::string create_rejects_bad_device(const Env& e) {
  int count = 0;
  e.ok(e.t.device_get_count(&count), "cuDeviceGetCount");
  CUmemAllocationProp p = e.prop();
  p.location.id = count;
  CUmemGenericAllocationHandle h{};
  const CUresult r = e.t.mem_create(&h, e.granularity, &p, 0);
  if (r == CUDA_SUCCESS) e.t.mem_release(h);
  e.expect_code(r, CUDA_ERROR_INVALID_DEVICE,
                "cuMemCreate on device " + std::to_string(count) + " of " + std::to_string(count));
  return "cuMemCreate on a device that does not exist -> CUDA_ERROR_INVALID_DEVICE";
}

std::string reserve_alignment(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 3 * g);
  Env::require(a.base() % g == 0, "cuMemAddressReserve(alignment 0) returned " + hex(a.base()) +
                                      ", not aligned to the granularity " + format_size(g));
  Va b(e, 3 * g, 4 * g);
  Env::require(b.base() % (4 * g) == 0, "cuMemAddressReserve(alignment " + format_size(4 * g) +
                                            ") returned " + hex(b.base()));
  Env::require(b.base() >= a.base() + a.size() || a.base() >= b.base() + b.size(),
               "two reservations overlap");
  return "bases aligned to the granularity (alignment 0) and to " + format_size(4 * g);
}

std::string address_free_must_match(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 4 * g);
  e.expect_code(e.t.mem_address_free(a.base(), 2 * g), CUDA_ERROR_INVALID_VALUE,
                "cuMemAddressFree of half a reservation");
  e.ok(a.free(), "cuMemAddressFree of the whole reservation");
  return "half a reservation -> CUDA_ERROR_INVALID_VALUE; the whole one frees";
}

std::string map_requires_reservation(const Env& e) {
  const size_t g = e.granularity;
  CUdeviceptr gone = 0;
  {
    Va a(e, g);
    gone = a.base();
    e.ok(a.free(), "cuMemAddressFree");
  }
  Handle h(e, g);
  const CUresult r = e.t.mem_map(gone, g, 0, h.get(), 0);
  if (r == CUDA_SUCCESS) e.t.mem_unmap(gone, g);
  e.expect_code(r, CUDA_ERROR_INVALID_VALUE, "cuMemMap at an address no longer reserved");
  return "cuMemMap outside any reservation -> CUDA_ERROR_INVALID_VALUE";
}

std::string map_offset_must_be_zero(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 2 * g);
  Handle h(e, 2 * g);
  // NOT_SUPPORTED, not INVALID_VALUE (measured on H100, driver 580.159.04, 2026-11-23).
  const CUresult r = e.t.mem_map(a.base(), g, g, h.get(), 0);
  if (r == CUDA_SUCCESS) e.t.mem_unmap(a.base(), g);
  e.expect_code(r, CUDA_ERROR_NOT_SUPPORTED,
                "cuMemMap of the second half of a handle (offset " + format_size(g) + ")");
  Mapping m(e, a.base(), h);
  return "offset != 0 -> CUDA_ERROR_NOT_SUPPORTED; the whole handle at offset 0 maps";
}

std::string map_over_mapping_fails(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 2 * g);
  Handle h1(e, 2 * g), h2(e, g);
  Mapping m(e, a.base(), h1);
  const CUresult r = e.t.mem_map(a.at(g), g, 0, h2.get(), 0);
  if (r == CUDA_SUCCESS) e.t.mem_unmap(a.at(g), g);
  e.expect_code(r, CUDA_ERROR_INVALID_VALUE, "cuMemMap over a range already mapped");
  return "mapping over a mapping -> CUDA_ERROR_INVALID_VALUE";
}

std::string access_starts_none(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, g);
  Handle h(e, g);
  const CUmemLocation loc = e.location();
  unsigned long long flags = 99;
  {
    Mapping m(e, a.base(), h);
    e.ok(e.t.mem_get_access(&flags, &loc, a.base()), "cuMemGetAccess after cuMemMap");
    Env::require(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE,
                 "a new mapping has access flags " + std::to_string(flags) + ", not PROT_NONE");
    m.grant();
    e.ok(e.t.mem_get_access(&flags, &loc, a.base()), "cuMemGetAccess after cuMemSetAccess");
    Env::require(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                 "after cuMemSetAccess(READWRITE) the flags are " + std::to_string(flags));
    e.ok(m.unmap(), "cuMemUnmap");
  }
  Mapping again(e, a.base(), h);
  e.ok(e.t.mem_get_access(&flags, &loc, a.base()), "cuMemGetAccess after a new cuMemMap");
  Env::require(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE,
               "mapping the range again kept access flags " + std::to_string(flags) +
                   " (every mapping starts with no access)");
  return "PROT_NONE after cuMemMap, READWRITE after cuMemSetAccess, PROT_NONE again after remap";
}

std::string data_round_trip(const Env& e) {
  const size_t g = e.granularity;
  const size_t pages = 4;
  Va a(e, pages * g);
  Handle h(e, pages * g);
  Mapping m(e, a.base(), h);
  m.grant();
  write_pages(e, a.base(), pages, 1);
  verify_pages(e, a.base(), pages, 1, "cuMemcpyHtoD then cuMemcpyDtoH");
  // A whole page, both ways.
  std::vector<unsigned char> out(g), in(g);
  for (size_t i = 0; i < g; ++i) out[i] = static_cast<unsigned char>(word(7, i / 8) >> (i % 8));
  e.ok(e.t.memcpy_htod(a.at(g), out.data(), g), "cuMemcpyHtoD of a whole page");
  e.ok(e.t.memcpy_dtoh(in.data(), a.at(g), g), "cuMemcpyDtoH of a whole page");
  Env::require(std::memcmp(in.data(), out.data(), g) == 0,
               "a whole page read back differs from what was written");
  return "words at both ends of " + std::to_string(pages) + " pages and one whole page read back";
}

std::string handle_keeps_data_across_remap(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 4 * g);
  Handle h(e, 2 * g);
  {
    Mapping m(e, a.base(), h);
    m.grant();
    write_pages(e, a.base(), 2, 2);
    e.ok(m.unmap(), "cuMemUnmap");
  }
  Mapping m(e, a.at(2 * g), h);
  m.grant();
  verify_pages(e, a.at(2 * g), 2, 2, "the handle mapped again at another address");
  return "a handle's bytes survive cuMemUnmap and cuMemMap at another address";
}

std::string unmap_partial_fails(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 2 * g);
  Handle h(e, 2 * g);
  Mapping m(e, a.base(), h);
  const CUresult r = e.t.mem_unmap(a.base(), g);
  if (r == CUDA_SUCCESS) m.forget();
  e.expect_code(r, CUDA_ERROR_INVALID_VALUE, "cuMemUnmap of half a mapping");
  e.ok(m.unmap(), "cuMemUnmap of the whole mapping");
  return "half a mapping -> CUDA_ERROR_INVALID_VALUE; the whole one unmaps";
}

// Whether va is mapped (cuMemRetainAllocationHandle finds a handle there).
bool is_mapped(const Env& e, CUdeviceptr va) {
  CUmemGenericAllocationHandle h{};
  if (e.t.mem_retain_allocation_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(va))) !=
      CUDA_SUCCESS) {
    return false;
  }
  e.t.mem_release(h);
  return true;
}

// A page never mapped is skipped, not an error: the whole mappings in the range go (measured on H100, driver 580.159.04, 2026-11-23).
std::string unmap_skips_unmapped(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 2 * g);
  Handle h(e, g);
  Mapping m(e, a.base(), h);
  e.expect_code(e.t.mem_unmap(a.at(g), g), CUDA_SUCCESS,
                "cuMemUnmap of a reserved page never mapped");
  Env::require(is_mapped(e, a.base()),
               "cuMemUnmap of a page never mapped unmapped the mapping beside it");
  e.expect_code(e.t.mem_unmap(a.base(), 2 * g), CUDA_SUCCESS,
                "cuMemUnmap of a mapping plus a page never mapped");
  Env::require(!is_mapped(e, a.base()),
               "cuMemUnmap of a mapping plus a page never mapped left the mapping in place");
  m.forget();
  return "ranges with a page never mapped -> CUDA_SUCCESS; the mappings inside are unmapped";
}

std::string range_of_mappings(const Env& e) {
  const size_t g = e.granularity;
  const size_t n = 4;
  Va a(e, n * g);
  std::vector<std::unique_ptr<Handle>> hs;
  std::vector<std::unique_ptr<Mapping>> ms;
  for (size_t i = 0; i < n; ++i) {
    hs.push_back(std::make_unique<Handle>(e, g));
    ms.push_back(std::make_unique<Mapping>(e, a.at(i * g), *hs.back()));
  }
  const CUmemAccessDesc d = e.read_write();
  e.ok(e.t.mem_set_access(a.base(), n * g, &d, 1), "cuMemSetAccess over 4 adjacent mappings");
  write_pages(e, a.base(), n, 3);
  // One copy across the boundary of two mappings.
  const uint64_t across[2] = {word(4, 0), word(4, 1)};
  e.ok(e.t.memcpy_htod(a.at(g - 8), across, sizeof across), "cuMemcpyHtoD across two mappings");
  uint64_t back[2] = {};
  e.ok(e.t.memcpy_dtoh(back, a.at(g - 8), sizeof back), "cuMemcpyDtoH across two mappings");
  Env::require(back[0] == across[0] && back[1] == across[1],
               "a copy across two adjacent mappings read back different bytes");
  e.ok(e.t.mem_unmap(a.base(), n * g), "cuMemUnmap over 4 adjacent mappings");
  for (auto& m : ms) m->forget();
  e.expect_code(e.t.mem_set_access(a.base(), n * g, &d, 1), CUDA_ERROR_INVALID_VALUE,
                "cuMemSetAccess over a range no longer mapped");
  // The range is a plain reservation again.
  Mapping again(e, a.base(), *hs[0]);
  return "one cuMemSetAccess and one cuMemUnmap cover 4 mappings; the range maps again";
}

std::string release_while_mapped(const Env& e) {
  const size_t g = e.granularity;
  const size_t size = 16 * g;
  const size_t slack = 8 * g;  // other processes may allocate meanwhile on a real GPU
  const size_t free0 = e.free_bytes();
  Va a(e, size);
  Handle h(e, size);
  const size_t free1 = e.free_bytes();
  Env::require(free1 + size <= free0 + slack,
               "cuMemCreate(" + format_size(size) + ") took " +
                   format_size(free0 > free1 ? free0 - free1 : 0) + " off cuMemGetInfo's free");
  Mapping m(e, a.base(), h);
  m.grant();
  write_pages(e, a.base(), 16, 5);
  e.ok(h.release(), "cuMemRelease of a mapped handle");
  verify_pages(e, a.base(), 16, 5, "after cuMemRelease, while still mapped");
  const size_t free2 = e.free_bytes();
  Env::require(free2 + size <= free0 + slack,
               "cuMemRelease of a mapped handle gave its memory back before cuMemUnmap (free " +
                   format_size(free2) + ", was " + format_size(free0) + " before cuMemCreate)");
  e.ok(m.unmap(), "cuMemUnmap of the released handle's mapping");
  const size_t free3 = e.free_bytes();
  Env::require(free3 + slack >= free0,
               "the last cuMemUnmap did not give the memory back (free " + format_size(free3) +
                   ", was " + format_size(free0) + ")");
  return "memory counted from cuMemCreate, kept and readable after cuMemRelease while mapped, "
         "given back at cuMemUnmap";
}

std::string retain_and_properties(const Env& e) {
  const size_t g = e.granularity;
  Va a(e, 2 * g);
  Handle h(e, 2 * g);
  Mapping m(e, a.base(), h);
  CUmemGenericAllocationHandle r{};
  e.ok(e.t.mem_retain_allocation_handle(&r, reinterpret_cast<void*>(a.at(g + 4096))),
       "cuMemRetainAllocationHandle inside a mapping");
  e.ok(e.t.mem_release(r), "cuMemRelease of the retained handle");
  Env::require(r == h.get(), "cuMemRetainAllocationHandle returned another handle value");
  CUmemAllocationProp p{};
  e.ok(e.t.mem_get_allocation_properties_from_handle(&p, h.get()),
       "cuMemGetAllocationPropertiesFromHandle");
  Env::require(p.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
                   p.location.type == CU_MEM_LOCATION_TYPE_DEVICE && p.location.id == e.ordinal,
               "the handle's properties are not pinned memory on device " +
                   std::to_string(e.ordinal));
  return "retain from an interior address gives the mapped handle; properties as created";
}

std::string streams_and_events(const Env& e) {
  CUstream s1 = nullptr, s2 = nullptr;
  CUevent ev = nullptr;
  struct Cleanup {
    const Env& e;
    CUstream& s1;
    CUstream& s2;
    CUevent& ev;
    ~Cleanup() {
      if (ev != nullptr) e.t.event_destroy(ev);
      if (s2 != nullptr) e.t.stream_destroy(s2);
      if (s1 != nullptr) e.t.stream_destroy(s1);
    }
  } cleanup{e, s1, s2, ev};
  e.ok(e.t.stream_create(&s1, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  e.ok(e.t.stream_create(&s2, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  e.ok(e.t.event_create(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate(DISABLE_TIMING)");
  e.expect_code(e.t.event_query(ev), CUDA_SUCCESS, "cuEventQuery of an event never recorded");
  e.ok(e.t.event_record(ev, s1), "cuEventRecord");
  e.ok(e.t.stream_wait_event(s2, ev, 0), "cuStreamWaitEvent");
  e.ok(e.t.event_synchronize(ev), "cuEventSynchronize");
  e.expect_code(e.t.event_query(ev), CUDA_SUCCESS, "cuEventQuery after cuEventSynchronize");
  e.ok(e.t.stream_synchronize(s2), "cuStreamSynchronize");
  e.expect_code(e.t.stream_query(s2), CUDA_SUCCESS, "cuStreamQuery of a synchronized stream");
  e.ok(e.t.event_record(ev, nullptr), "cuEventRecord on the legacy default stream");
  e.ok(e.t.ctx_synchronize(), "cuCtxSynchronize");
  e.expect_code(e.t.event_query(ev), CUDA_SUCCESS, "cuEventQuery after cuCtxSynchronize");
  return "events record, wait, synchronize and query as documented on two streams";
}

std::string context_required(const Env& e) {
  // The caller made the primary context current; take it off this thread for the check.
  CUcontext popped = nullptr;
  e.ok(e.t.ctx_pop_current(&popped), "cuCtxPopCurrent");
  CUcontext cur = nullptr;
  const CUresult g = e.t.ctx_get_current(&cur);
  CUstream s = nullptr;
  size_t free = 0, total = 0;
  CUresult rs = CUDA_SUCCESS, ri = CUDA_SUCCESS;
  if (g == CUDA_SUCCESS && cur == nullptr) {
    rs = e.t.stream_create(&s, 0);
    if (rs == CUDA_SUCCESS) e.t.stream_destroy(s);
    ri = e.t.mem_get_info(&free, &total);
  }
  e.ok(e.t.ctx_push_current(popped), "cuCtxPushCurrent");
  e.ok(g, "cuCtxGetCurrent");
  if (cur != nullptr) return "skipped: this thread has another current context";
  e.expect_code(rs, CUDA_ERROR_INVALID_CONTEXT, "cuStreamCreate with no current context");
  e.expect_code(ri, CUDA_ERROR_INVALID_CONTEXT, "cuMemGetInfo with no current context");
  return "cuStreamCreate and cuMemGetInfo with no current context -> CUDA_ERROR_INVALID_CONTEXT";
}

}  // namespace

const std::vector<Check>& all_checks() {
  static const std::vector<Check> checks = {
      {"vmm_supported", vmm_supported},
      {"granularity", granularity},
      {"create_rejects_unaligned_size", create_rejects_unaligned_size},
      {"create_rejects_bad_device", create_rejects_bad_device},
      {"reserve_alignment", reserve_alignment},
      {"address_free_must_match", address_free_must_match},
      {"map_requires_reservation", map_requires_reservation},
      {"map_offset_must_be_zero", map_offset_must_be_zero},
      {"map_over_mapping_fails", map_over_mapping_fails},
      {"access_starts_none", access_starts_none},
      {"data_round_trip", data_round_trip},
      {"handle_keeps_data_across_remap", handle_keeps_data_across_remap},
      {"unmap_partial_fails", unmap_partial_fails},
      {"unmap_skips_unmapped", unmap_skips_unmapped},
      {"range_of_mappings", range_of_mappings},
      {"release_while_mapped", release_while_mapped},
      {"retain_and_properties", retain_and_properties},
      {"streams_and_events", streams_and_events},
      {"context_required", context_required},
  };
  return checks;
}

}  // namespace expanse::tools::selftest
