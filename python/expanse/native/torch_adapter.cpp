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
  // The library words it (expanse_format_oom), as it does for expanse_torch_malloc.
  std::string m(1024, '\0');
  for (int round = 0; round < 2; ++round) {
    size_t n = m.size();
    if (expanse_format_oom(requested, device, &s, expanse_error.c_str(), m.data(), &n) !=
        EXPANSE_OK) {
      break;
    }
    if (n <= m.size()) {
      m.resize(n - 1);
      return m;
    }
    m.resize(n);
  }
  return "CUDA out of memory. Tried to allocate " + format_size(requested) + ". " + expanse_error;
}

// ---- memory pools ---------------------------------------------------------------------------

std::string pool_name(const MempoolKey& k) {
  return "memory pool (" + std::to_string(k.first) + ", " + std::to_string(k.second) +
         ") on device " + std::to_string(k.device);
}

namespace {

// A slot number (from 1) and a generation, as the void* expanse hands back to the trampoline.
void* filter_ctx(size_t slot, uint32_t generation) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(((uint64_t{slot} + 1) << 32) | generation));
}
void decode_ctx(void* ctx, size_t* slot, uint32_t* generation) {
  const uint64_t v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ctx));
  *slot = static_cast<size_t>((v >> 32) - 1);  // 0 (never handed out) wraps: no such slot
  *generation = static_cast<uint32_t>(v);
}

[[noreturn]] void pool_failed(const char* what, const MempoolKey& k, const char* call) {
  throw PoolError(std::string(what) + ": " + pool_name(k) + ": " + call +
                  " failed: " + expanse_last_error());
}

expanse_pool_stats stats_of_pool(expanse_pool_id id, const char* what, const MempoolKey& k) {
  expanse_pool_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (expanse_pool_get_stats(id, &s) != EXPANSE_OK) pool_failed(what, k, "expanse_pool_get_stats");
  return s;
}

// Released, its memory given back, none of its blocks live: nothing of it is left.
bool finished(const expanse_pool_stats& s) {
  return s.released != 0 && s.returned != 0 && s.live_blocks == 0;
}

}  // namespace

FilterTable& FilterTable::instance() {
  static FilterTable* t = new FilterTable();  // never destroyed: expanse may call it at exit
  return *t;
}

void* FilterTable::add(Filter f) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    slots_.emplace_back();
    i = slots_.size() - 1;
  }
  Slot& s = slots_[i];
  s.filter = std::move(f);
  s.used = true;
  ++held_;
  return filter_ctx(i, s.generation);
}

void FilterTable::remove(void* ctx) {
  size_t i = 0;
  uint32_t gen = 0;
  decode_ctx(ctx, &i, &gen);
  Filter gone;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (i >= slots_.size() || !slots_[i].used || slots_[i].generation != gen) return;
    Slot& s = slots_[i];
    s.used = false;
    s.generation = s.generation == UINT32_MAX ? 1 : s.generation + 1;
    idle_.wait(lock, [&] { return slots_[i].in_flight == 0; });
    gone = std::move(s.filter);
    s.filter = nullptr;
    free_.push_back(static_cast<uint32_t>(i));
    --held_;
  }
  // `gone` (PyTorch's filter and what it captured) is destroyed here, outside the lock.
}

int FilterTable::trampoline(CUstream_st* stream, void* ctx) {
  return instance().call(stream, ctx);
}

int FilterTable::call(CUstream_st* stream, void* ctx) {
  size_t i = 0;
  uint32_t gen = 0;
  decode_ctx(ctx, &i, &gen);
  const Filter* f = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (i >= slots_.size() || !slots_[i].used || slots_[i].generation != gen) return 0;
    ++slots_[i].in_flight;
    f = &slots_[i].filter;  // not changed while a call is in flight (remove waits)
  }
  int r = 0;
  try {
    r = (*f)(stream) ? 1 : 0;
  } catch (...) {
    // An exception cannot cross expanse's C frames. PyTorch's capture filter throws only when
    // cudaStreamGetCaptureInfo fails, i.e. for a stream that is not part of its capture.
    r = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--slots_[i].in_flight == 0) idle_.notify_all();
  }
  return r;
}

size_t FilterTable::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

PoolMap::Entry& PoolMap::acquire(const MempoolKey& k, const char* what, bool* created) {
  *created = false;
  auto it = pools_.find(k);
  if (it != pools_.end()) {
    Entry& e = it->second;
    const expanse_pool_stats s = stats_of_pool(e.id, what, k);
    if (s.released == 0) {
      if (expanse_pool_retain(e.id) != EXPANSE_OK) pool_failed(what, k, "expanse_pool_retain");
      return e;
    }
    if (!finished(s) || e.routing) {
      throw PoolError(
          std::string(what) + ": " + pool_name(k) +
          " was released (its use count reached 0) and expanse still holds memory of it (" +
          std::to_string(s.live_blocks) + " live blocks, " + format_size(s.cached_bytes) +
          " cached); a released pool cannot be used again (PyTorch's allocator refuses it "
          "too: its use_count > 0 assertion). Use a new pool (torch.cuda.graph_pool_handle(), "
          "torch.cuda.MemPool()), or free the pool's tensors and call torch.cuda.empty_cache() "
          "first; nothing was changed");
    }
    pools_.erase(it);  // PyTorch has forgotten it too: the pair names a new pool
  }
  expanse_pool_id id = 0;
  if (expanse_pool_create(k.device, &id) != EXPANSE_OK) pool_failed(what, k, "expanse_pool_create");
  *created = true;
  Entry& e = pools_[k];
  e = Entry{};
  e.id = id;
  return e;
}

PoolMap::~PoolMap() {
  for (auto& [k, e] : pools_) {
    (void)k;
    if (!e.routing) continue;
    (void)expanse_pool_end(e.id);
    FilterTable::instance().remove(e.filter_ctx);
  }
}

void PoolMap::begin(const MempoolKey& k, Filter filter) {
  const char* what = "beginAllocateToPool";
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  if (it != pools_.end() && it->second.routing) {
    throw PoolError(std::string(what) + ": " + pool_name(k) +
                    " is being allocated to already (its endAllocateToPool has not come); "
                    "nothing was changed");
  }
  FilterTable& filters = FilterTable::instance();
  void* ctx = filters.add(std::move(filter));
  bool created = false;
  Entry* e = nullptr;
  try {
    e = &acquire(k, what, &created);
  } catch (...) {
    filters.remove(ctx);
    throw;
  }
  if (expanse_pool_begin_filter(e->id, &FilterTable::trampoline, ctx) != EXPANSE_OK) {
    const std::string why = expanse_last_error();
    (void)expanse_pool_release(e->id);  // the use acquire took
    if (created) pools_.erase(k);
    filters.remove(ctx);
    throw PoolError(std::string(what) + ": " + pool_name(k) +
                    ": expanse_pool_begin_filter failed: " + why);
  }
  e->routing = true;
  e->filter_ctx = ctx;
}

void PoolMap::end(const MempoolKey& k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  if (it == pools_.end() || !it->second.routing) {
    throw PoolError("endAllocateToPool: " + pool_name(k) +
                    " is not being allocated to (no beginAllocateToPool, or it ended already); "
                    "nothing was changed");
  }
  Entry& e = it->second;
  const int rc = expanse_pool_end(e.id);
  const std::string why = rc == EXPANSE_OK ? std::string() : expanse_last_error();
  // Whatever expanse answered, the filter routes nothing from here on (its generation is gone).
  FilterTable::instance().remove(e.filter_ctx);
  e.filter_ctx = nullptr;
  e.routing = false;
  if (rc != EXPANSE_OK) {
    throw PoolError("endAllocateToPool: " + pool_name(k) + ": expanse_pool_end failed: " + why);
  }
}

void PoolMap::release(const MempoolKey& k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  if (it == pools_.end()) {
    throw PoolError("releasePool: " + pool_name(k) +
                    " does not exist (never begun or created); nothing was changed");
  }
  if (expanse_pool_release(it->second.id) != EXPANSE_OK) {
    pool_failed("releasePool", k, "expanse_pool_release");
  }
}

void PoolMap::create_or_incref(const MempoolKey& k) {
  std::lock_guard<std::mutex> lock(mu_);
  bool created = false;
  (void)acquire(k, "createOrIncrefPool", &created);
}

int PoolMap::use_count(const MempoolKey& k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  if (it == pools_.end()) return 0;
  return stats_of_pool(it->second.id, "getPoolUseCount", k).use_count;
}

expanse_pool_id PoolMap::id_of(const MempoolKey& k) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  return it == pools_.end() ? 0 : it->second.id;
}

void PoolMap::empty_cache(uint64_t first, uint64_t second) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pools_.begin(); it != pools_.end();) {
    const MempoolKey& k = it->first;
    if (k.first != first || k.second != second) {
      ++it;
      continue;
    }
    const expanse_pool_stats s = stats_of_pool(it->second.id, "emptyCache", k);
    if (s.released != 0 && s.returned == 0) {
      const int rc = expanse_pool_trim(it->second.id);
      // EXPANSE_EBUSY: a capture is announced on the device; its memory goes back at a later
      // empty_cache (or when expanse needs it).
      if (rc != EXPANSE_OK && rc != EXPANSE_EBUSY) pool_failed("emptyCache", k, "expanse_pool_trim");
    }
    if (!it->second.routing && finished(stats_of_pool(it->second.id, "emptyCache", k))) {
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

void PoolMap::forget_finished() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pools_.begin(); it != pools_.end();) {
    expanse_pool_stats s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    if (!it->second.routing && expanse_pool_get_stats(it->second.id, &s) == EXPANSE_OK &&
        finished(s)) {
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

bool PoolMap::live_allocations_are(const MempoolKey& k,
                                   const std::unordered_set<void*>& expected) const {
  const char* what = "checkPoolLiveAllocations";
  expanse_pool_id id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(k);
    if (it == pools_.end()) {
      throw PoolError(std::string(what) + ": " + pool_name(k) +
                      " does not exist (never begun or created)");
    }
    id = it->second.id;
  }
  // Every expected pointer a live block of the pool, and as many live blocks as pointers: the
  // live blocks are exactly those.
  for (void* p : expected) {
    expanse_pool_id of = 0;
    if (expanse_pool_of(p, &of) != EXPANSE_OK || of != id) return false;
  }
  return stats_of_pool(id, what, k).live_blocks == expected.size();
}

void PoolMap::set_use_on_oom(const MempoolKey& k, bool use) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(k);
  if (it == pools_.end()) {
    throw PoolError("setUseOnOOM: " + pool_name(k) +
                    " does not exist (never begun or created); nothing was changed");
  }
  it->second.use_on_oom = use;
  it->second.oom_order = next_oom_order_++;
}

std::vector<expanse_pool_id> PoolMap::use_on_oom(int device) const {
  std::vector<std::pair<uint64_t, expanse_pool_id>> marked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, e] : pools_) {
      if (k.device == device && e.use_on_oom) marked.emplace_back(e.oom_order, e.id);
    }
  }
  std::sort(marked.begin(), marked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<expanse_pool_id> out;
  for (const auto& m : marked) out.push_back(m.second);
  return out;
}

size_t PoolMap::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pools_.size();
}

}  // namespace expanse::torch_adapter
