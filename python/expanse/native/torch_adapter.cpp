// The torch-free half of expanse's native PyTorch allocator: see torch_adapter.hpp.
#include "torch_adapter.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace expanse::torch_adapter {

namespace {

int64_t i64(uint64_t v) { return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v); }

uint64_t since(uint64_t now, uint64_t base) { return now >= base ? now - base : 0; }

}  // namespace

int read_stats(int device, expanse_stats& out) {
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  return expanse_get_stats(device, &out);
}

int read_segments(int device, Segments& out) {
  // The books may grow between the call that counts and the call that copies: retry with the
  // new totals (a few rounds suffice unless another thread allocates without pause).
  for (int round = 0; round < 16; ++round) {
    size_t ns = out.segments.size(), nb = out.blocks.size();
    const int rc = expanse_get_segments(device, ns ? out.segments.data() : nullptr, &ns,
                                        nb ? out.blocks.data() : nullptr, &nb);
    if (rc != EXPANSE_OK) return rc;
    if (ns <= out.segments.size() && nb <= out.blocks.size()) {
      out.segments.resize(ns);
      out.blocks.resize(nb);
      return EXPANSE_OK;
    }
    out.segments.resize(ns + ns / 4 + 4);
    out.blocks.resize(nb + nb / 4 + 16);
  }
  // Allocating faster than it can be copied: the last copy, whatever fitted (a segment's blocks
  // past the copied ones are left out by pool_figures).
  size_t ns = out.segments.size(), nb = out.blocks.size();
  const int rc = expanse_get_segments(device, out.segments.data(), &ns, out.blocks.data(), &nb);
  out.segments.resize(std::min(ns, out.segments.size()));
  out.blocks.resize(std::min(nb, out.blocks.size()));
  return rc;
}

int read_trace(int device, std::vector<expanse_trace_entry>& out) {
  for (int round = 0; round < 16; ++round) {
    size_t n = out.size();
    const int rc = expanse_get_trace(device, n ? out.data() : nullptr, &n);
    if (rc != EXPANSE_OK) return rc;
    if (n <= out.size()) {
      out.resize(n);
      return EXPANSE_OK;
    }
    out.resize(n + n / 4 + 16);
  }
  // Recording faster than it can be copied: the last copy, whatever fitted.
  size_t n = out.size();
  const int rc = expanse_get_trace(device, out.data(), &n);
  if (n < out.size()) out.resize(n);
  return rc;
}

std::array<PoolFigures, kNumPools> pool_figures(const Segments& segs) {
  std::array<PoolFigures, kNumPools> f{};
  for (const expanse_segment_info& s : segs.segments) {
    PoolFigures& p = f[s.small_arena ? kSmallPool : kLargePool];
    p.segments += 1;
    p.segment_bytes += i64(s.size);
    const uint64_t end = std::min<uint64_t>(s.first_block + s.num_blocks, segs.blocks.size());
    for (uint64_t i = s.first_block; i < end; ++i) {
      const expanse_block_info& b = segs.blocks[i];
      switch (b.state) {
        case EXPANSE_BLOCK_LIVE:
          p.live_blocks += 1;
          p.live_bytes += i64(b.size);
          p.requested_bytes += i64(b.requested);
          break;
        case EXPANSE_BLOCK_AWAITING_FREE:
          p.awaiting_blocks += 1;
          p.awaiting_bytes += i64(b.size);
          break;
        default:
          p.free_blocks += 1;
          p.free_bytes += i64(b.size);
          break;
      }
    }
  }
  PoolFigures& a = f[kAggregate];
  for (size_t k : {kSmallPool, kLargePool}) {
    a.segments += f[k].segments;
    a.segment_bytes += f[k].segment_bytes;
    a.live_blocks += f[k].live_blocks;
    a.live_bytes += f[k].live_bytes;
    a.requested_bytes += f[k].requested_bytes;
    a.awaiting_blocks += f[k].awaiting_blocks;
    a.awaiting_bytes += f[k].awaiting_bytes;
    a.free_blocks += f[k].free_blocks;
    a.free_bytes += f[k].free_bytes;
  }
  return f;
}

uint64_t context_syncs(const expanse_stats& s) {
  for (uint32_t i = 0; i < s.num_entry_points && i < EXPANSE_MAX_ENTRY_POINTS; ++i) {
    const char* name = expanse_entry_point_name(static_cast<int>(i));
    if (name != nullptr && std::strcmp(name, "cuCtxSynchronize") == 0) return s.driver_calls[i];
  }
  return 0;
}

DeviceStats map_device_stats(const expanse_stats& s, const Segments& segs, Baseline& b) {
  DeviceStats d;
  const auto f = pool_figures(segs);
  for (size_t k = 0; k < kNumPools; ++k) {
    d.allocation[k].current = f[k].live_blocks;
    d.segment[k].current = f[k].segments;
    d.active[k].current = f[k].live_blocks + f[k].awaiting_blocks;
    d.inactive_split[k].current = f[k].free_blocks;
    d.allocated_bytes[k].current = f[k].live_bytes;
    d.reserved_bytes[k].current = f[k].segment_bytes;
    d.active_bytes[k].current = f[k].live_bytes + f[k].awaiting_bytes;
    d.inactive_split_bytes[k].current = f[k].free_bytes;
    d.requested_bytes[k].current = f[k].requested_bytes;
  }
  // Reserved is all physical memory expanse holds: its mapped segments plus the pages it keeps
  // unmapped for reuse (pooled_bytes), which belong to no arena and are counted in the large pool.
  const int64_t pooled = i64(s.pooled_bytes);
  d.reserved_bytes[kLargePool].current += pooled;
  d.reserved_bytes[kAggregate].current += pooled;

  // Aggregate accumulations expanse counts.
  d.allocation[kAggregate].allocated = i64(since(s.num_allocs, b.num_allocs));
  d.allocation[kAggregate].freed = i64(since(s.num_frees, b.num_frees));
  d.num_ooms = i64(since(s.num_ooms, b.num_ooms));
  d.num_device_alloc = i64(since(s.num_created_pages, b.created_pages));
  d.num_device_free = i64(since(s.num_released_pages, b.released_pages));
  d.num_sync_all_streams = i64(since(context_syncs(s), b.syncs));

  // Peaks: expanse's exact ones where it keeps them, else the highest value seen by reads.
  StatArray* arrays[9] = {&d.allocation,      &d.segment,        &d.active,
                          &d.inactive_split,  &d.allocated_bytes, &d.reserved_bytes,
                          &d.active_bytes,    &d.inactive_split_bytes, &d.requested_bytes};
  d.allocated_bytes[kAggregate].peak = i64(s.peak_allocated_bytes);
  d.requested_bytes[kAggregate].peak = i64(s.peak_requested_bytes);
  d.reserved_bytes[kAggregate].peak = i64(s.peak_physical_bytes);
  for (size_t a = 0; a < 9; ++a) {
    for (size_t k = 0; k < kNumPools; ++k) {
      Stat& st = (*arrays[a])[k];
      Stat& seen = b.seen_peaks[a][k];
      seen.peak = std::max({seen.peak, st.current, st.peak});
      st.peak = seen.peak;
    }
  }
  return d;
}

void reset_accumulated(const expanse_stats& s, Baseline& b) {
  b.num_allocs = s.num_allocs;
  b.num_frees = s.num_frees;
  b.num_ooms = s.num_ooms;
  b.created_pages = s.num_created_pages;
  b.released_pages = s.num_released_pages;
  b.syncs = context_syncs(s);
}

void reset_seen_peaks(Baseline& b) { b.seen_peaks = {}; }

uint64_t largest_block(const expanse_stats& s, uint64_t device_free) {
  const uint64_t page = s.page_size ? s.page_size : 1;
  const uint64_t unused = s.cached_bytes + s.pooled_bytes;  // held by expanse, no live block on it
  if (device_free == UINT64_MAX) {
    device_free = s.capacity_bytes > s.physical_bytes ? s.capacity_bytes - s.physical_bytes : 0;
  }
  uint64_t largest = device_free + unused;
  // Under a limit, what live blocks touch counts against it and nothing else does.
  if (s.limit_bytes != UINT64_MAX) {
    const uint64_t room = s.limit_bytes > s.touched_bytes ? s.limit_bytes - s.touched_bytes : 0;
    largest = std::min(largest, room);
  }
  return largest / page * page;
}

uint64_t limit_for_fraction(const expanse_stats& s, double fraction) {
  if (!(fraction < 1.0)) return SIZE_MAX;  // 1 (or NaN, refused earlier): no cap
  const uint64_t page = s.page_size ? s.page_size : 1;
  const double bytes = std::floor(fraction * static_cast<double>(s.capacity_bytes));
  const uint64_t b = bytes <= 0 ? 0 : static_cast<uint64_t>(bytes);
  return b / page * page;
}

double fraction_of_limit(const expanse_stats& s) {
  if (s.limit_bytes == UINT64_MAX || s.limit_bytes >= s.capacity_bytes || s.capacity_bytes == 0) {
    return 1.0;
  }
  return static_cast<double>(s.limit_bytes) / static_cast<double>(s.capacity_bytes);
}

OomObserverArgs oom_observer_args(uint64_t requested, const expanse_stats& s) {
  OomObserverArgs o;
  o.alloc_size = requested;
  const bool capped = s.limit_bytes != UINT64_MAX && s.limit_bytes < s.capacity_bytes;
  o.device_total = capped ? s.limit_bytes : s.capacity_bytes;
  o.device_free = o.device_total > s.touched_bytes ? o.device_total - s.touched_bytes : 0;
  return o;
}

void remember_fraction(Baseline& b, double fraction, uint64_t limit) {
  b.fraction = fraction;
  b.fraction_limit = limit;
}

double memory_fraction(const expanse_stats& s, const Baseline& b) {
  const uint64_t limit = b.fraction_limit == SIZE_MAX ? UINT64_MAX : b.fraction_limit;
  if (b.fraction >= 0 && s.limit_bytes == limit) return b.fraction;
  return fraction_of_limit(s);
}

std::string format_size(uint64_t n) {
  char buf[64];
  if (n <= 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes", n);
  } else if (n <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(n) / 1024.0);
  } else if (n <= 1073741824ULL) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / 1073741824.0);
  }
  return buf;
}

std::string oom_message(uint64_t requested, int device, const expanse_stats& s,
                        const std::string& expanse_error) {
  std::string m = "CUDA out of memory. Tried to allocate " + format_size(requested) + ".";
  if (s.capacity_bytes != 0) {
    const bool capped = s.limit_bytes != UINT64_MAX && s.limit_bytes < s.capacity_bytes;
    const uint64_t cap = capped ? s.limit_bytes : s.capacity_bytes;
    const uint64_t free = cap > s.touched_bytes ? cap - s.touched_bytes : 0;
    m += " GPU " + std::to_string(device) + " has a total capacity of " +
         format_size(s.capacity_bytes) + " of which " + format_size(free) +
         " is free to expanse (not touched by live blocks" +
         (capped ? ", under its limit of " + format_size(s.limit_bytes) : std::string()) +
         "). Of the allocated memory " + format_size(s.allocated_bytes) +
         " is allocated by PyTorch through expanse, and " + format_size(s.cached_bytes) +
         " is reserved by expanse but unallocated.";
  }
  // expanse's own messages start with "expanse"; anything else gets the name.
  if (!expanse_error.empty()) {
    m += expanse_error.rfind("expanse", 0) == 0 ? " " + expanse_error : " expanse: " + expanse_error;
  }
  return m;
}

}  // namespace expanse::torch_adapter
