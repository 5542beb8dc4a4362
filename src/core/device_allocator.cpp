#include "core/device_allocator.hpp"

#include "driver/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cassert>
#include <cinttypes>
#include <cstdio>
#include <sstream>

namespace expanse::core {
namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// How many free blocks (in size order) placement inspects looking for one whose pages are all
// mapped already, before settling for the best fit and mapping pages under it.
constexpr size_t kMappedSearchBudget = 32;

std::string hex(CUdeviceptr p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, static_cast<uint64_t>(p));
  return buf;
}

std::string stream_name(CUstream s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", static_cast<void*>(s));
  return buf;
}

}  // namespace

// What one ensure_pages() call tried, for the OOM message.
struct DeviceAllocator::PageRequest {
  size_t bytes = 0;
  CUstream stream = nullptr;
  size_t needed = 0;
  size_t from_pool = 0;
  size_t reclaimed = 0;
  size_t created = 0;
  bool create_oom = false;
  bool limit_hit = false;
  bool waited = false;
  bool va_exhausted = false;
};

DeviceAllocator::DeviceAllocator(const driver::LoadedDriver& drv, int device,
                                 const AllocatorOptions& opts)
    : drv_(drv, device), opts_(opts) {
  const size_t g = drv_.granularity();
  page_ = opts.page_size != 0 ? opts.page_size : g;
  if (page_ % g != 0) {
    throw usage_error("expanse: page_size " + conf::format_size(page_) +
                      " is not a multiple of device " + std::to_string(device) +
                      "'s granularity " + conf::format_size(g));
  }
  capacity_pages_ = drv_.total_memory() / page_;
  limit_pages_ = opts.limit == kNoLimit ? SIZE_MAX : opts.limit / page_;
  const size_t cap = round_up(std::max<size_t>(drv_.total_memory(), page_), page_);
  if (opts_.va_size == 0) opts_.va_size = 2 * cap;
  if (opts_.small_va_size == 0) opts_.small_va_size = std::max<size_t>(cap / 4, size_t{1} << 30);
  opts_.va_size = round_up(opts_.va_size, page_);
  opts_.small_va_size = round_up(opts_.small_va_size, page_);
  va_budget_ = opts.va_budget != 0 ? opts.va_budget : 64 * cap;
  if (opts_.small_max > opts_.small_va_size) opts_.small_max = opts_.small_va_size;
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Shutdown: wait for all work, then give everything back. Errors are swallowed: at process exit
  // the driver may already be shutting down (CUDA_ERROR_DEINITIALIZED).
  try {
    poll(true);
  } catch (...) {
  }
  for (auto& rp : reservations_) {
    if (!rp || !rp->alive) continue;
    Reservation& r = *rp;
    for (size_t p = 0; p < r.page_count(); ++p) {
      if (!r.mapped(p)) continue;
      try {
        drv_.unmap(r.page_addr(p), page_);
        pool_.push_back(r.handles[p]);
      } catch (...) {
      }
      r.handles[p] = 0;
    }
    try {
      drv_.address_free(r.base, r.size);
    } catch (...) {
    }
  }
  for (auto h : pool_) {
    try {
      drv_.release(h);
    } catch (...) {
    }
  }
  for (auto e : all_events_) {
    try {
      drv_.event_destroy(e);
    } catch (...) {
    }
  }
}

DeviceAllocator::StreamState& DeviceAllocator::stream_state(CUstream s) { return streams_[s]; }

// ---- allocate --------------------------------------------------------------------------------

void* DeviceAllocator::allocate(size_t bytes, CUstream stream) {
  if (bytes == 0) return nullptr;
  if (bytes > SIZE_MAX / 2) {
    throw usage_error("expanse: allocation size " + std::to_string(bytes) +
                      " bytes on device " + std::to_string(device()) +
                      " overflows (larger than half the address space)");
  }
  const size_t sz = round_up(bytes, kBlockAlignment);
  const Arena a = arena_for(sz);

  std::lock_guard<std::mutex> lock(mu_);
  StreamState& ss = stream_state(stream);
  // Hot path: an exact-size block this stream freed recently. Its pages are still mapped.
  for (size_t i = ss.lifo.size(); i-- > 0;) {
    BlockIt it = ss.lifo[i];
    const Reservation& r = res(it->second.res);
    // Reused only if that touches no more new pages than a fresh placement would.
    if (it->second.size != sz || r.arena != a) continue;
    const size_t fresh = untouched_pages(r, it->first, sz);
    if (fresh <= (sz + page_ - 1) / page_ &&
        (limit_pages_ == SIZE_MAX || touched_pages_ + fresh <= limit_pages_)) {
      ss.lifo.erase(ss.lifo.begin() + static_cast<std::ptrdiff_t>(i));
      make_live(it, bytes, stream);
      return reinterpret_cast<void*>(it->first);
    }
  }

  PageRequest req;
  req.bytes = bytes;
  req.stream = stream;
  try {
    size_t offset = 0;
    BlockIt it = find_block(sz, a, stream, req, &offset);
    it = index_.carve(it, sz, a, offset);
    it->second.state = BlockState::live;  // out of the index: reclaim cannot pick its pages
    Reservation& r = res(it->second.res);
    try {
      if (limit_pages_ != SIZE_MAX &&
          touched_pages_ + untouched_pages(r, it->first, sz) > limit_pages_) {
        req.limit_hit = true;
        req.needed = untouched_pages(r, it->first, sz);
        throw_oom(req);
      }
      ensure_pages(r, r.first_page(it->first), r.last_page(it->first, sz), req);
    } catch (...) {
      index_.insert_free(it, a);
      throw;
    }
    make_live(it, bytes, stream);
    return reinterpret_cast<void*>(it->first);
  } catch (const out_of_memory&) {
    ++stats_.num_ooms;
    throw;
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: allocating " + std::to_string(bytes) + " bytes on device " +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

// Pages of [addr, addr+bytes) in r that no live block touches. Only the first and last page can
// be touched already (by neighbours); inner pages of a free range are touched by nobody.
size_t DeviceAllocator::untouched_pages(const Reservation& r, CUdeviceptr addr, size_t bytes) const {
  size_t a = r.first_page(addr), z = r.last_page(addr, bytes);
  size_t n = z - a + 1;
  if (r.edge_refs[a] != 0) --n;
  if (z != a && r.edge_refs[z] != 0) --n;
  return n;
}

// A placement of sz bytes inside free block c that needs at most ceil(sz / page) new pages
// (invariant 1): at its start when the first page is shared with a live neighbour or the start is
// page-aligned, else on the first page boundary inside c. False when c cannot hold either.
bool DeviceAllocator::tight_offset(BlockIt c, size_t sz, size_t* off) const {
  const Reservation& r = res(c->second.res);
  if (untouched_pages(r, c->first, sz) <= (sz + page_ - 1) / page_) {
    *off = 0;
    return true;
  }
  const size_t rel = static_cast<size_t>(c->first - r.base);
  const size_t skip = round_up(rel, page_) - rel;
  if (skip + sz > c->second.size) return false;
  *off = skip;
  return true;
}

// Chooses where a block of sz bytes goes: a free block this stream may use, and the offset into
// it. Already-mapped memory first (no driver call, no page held twice); then the best fit, whose
// missing pages ensure_pages() provides; then fresh VA.
BlockIt DeviceAllocator::find_block(size_t sz, Arena a, CUstream stream, PageRequest& req,
                                    size_t* offset) {
  auto mapped_and_tight = [&](BlockIt c) {
    size_t off = 0;
    if (!tight_offset(c, sz, &off)) return false;
    const Reservation& r = res(c->second.res);
    if (!r.all_mapped(r.first_page(c->first + off), r.last_page(c->first + off, sz))) {
      return false;
    }
    *offset = off;
    return true;
  };
  auto tight = [&](BlockIt c) { return tight_offset(c, sz, offset); };

  BlockIt it = index_.first_fit_where(a, sz, stream, kMappedSearchBudget, mapped_and_tight);
  if (it != index_.end()) return it;
  // Other streams' frees may have completed since: make them usable before mapping more.
  if (!pending_.empty() || !index_.streams_with_unsafe().empty()) {
    poll(false);
    it = index_.first_fit_where(a, sz, stream, kMappedSearchBudget, mapped_and_tight);
    if (it != index_.end()) return it;
  }
  it = index_.first_fit_where(a, sz, stream, kMappedSearchBudget, tight);
  if (it != index_.end()) return it;
  Reservation* fresh = add_reservation(a, sz);
  if (fresh != nullptr) {
    *offset = 0;
    return index_.blocks().find(fresh->base);
  }
  // Out of VA budget: free memory owned by other streams may be all that is left.
  flush_lifos();
  poll(true);
  req.waited = true;
  it = index_.first_fit_where(a, sz, stream, SIZE_MAX, tight);
  if (it != index_.end()) return it;
  req.va_exhausted = true;
  throw_oom(req);
}

Reservation* DeviceAllocator::add_reservation(Arena a, size_t min_bytes) {
  size_t size = a == Arena::small ? opts_.small_va_size : opts_.va_size;
  size = std::max(size, round_up(min_bytes, page_));
  if (va_reserved_ + size > va_budget_) {
    if (va_reserved_ + round_up(min_bytes, page_) > va_budget_) return nullptr;
    size = round_up(min_bytes, page_);
  }
  CUdeviceptr base = drv_.reserve(size, page_);
  auto id = static_cast<uint32_t>(reservations_.size());
  reservations_.push_back(std::make_unique<Reservation>(id, a, base, size, page_));
  index_.add_reservation(*reservations_.back());
  va_reserved_ += size;
  stats_.peak_va_reserved_bytes = std::max<uint64_t>(stats_.peak_va_reserved_bytes, va_reserved_);
  return reservations_.back().get();
}

CUmemGenericAllocationHandle DeviceAllocator::take_pool() {
  CUmemGenericAllocationHandle h = pool_.back();
  pool_.pop_back();
  return h;
}

void DeviceAllocator::ensure_pages(Reservation& r, size_t first, size_t last, PageRequest& req) {
  std::vector<size_t> need;
  for (size_t p = first; p <= last; ++p) {
    if (!r.mapped(p)) need.push_back(p);
  }
  if (need.empty()) return;
  const size_t k = need.size();
  req.needed = k;

  // Gather k physical pages: the pool first; then new pages and pages reclaimed from under free
  // memory anywhere, in the order the policy asks (AllocatorOptions::reclaim_before_create).
  std::vector<CUmemGenericAllocationHandle> hs;
  hs.reserve(k);
  try {
    while (hs.size() < k && !pool_.empty()) {
      hs.push_back(take_pool());
      ++req.from_pool;
    }
    auto create_more = [&] {
      while (hs.size() < k && !req.create_oom) {
        if (mapped_pages_ + pool_.size() + hs.size() >= limit_pages_) {
          req.limit_hit = true;
          return;
        }
        CUmemGenericAllocationHandle h = 0;
        if (drv_.create(page_, &h) == CUDA_ERROR_OUT_OF_MEMORY) {
          req.create_oom = true;
          return;
        }
        hs.push_back(h);
        ++req.created;
        ++stats_.num_created_pages;
      }
    };
    auto reclaim_more = [&] {
      if (hs.size() >= k) return;
      if (!pending_.empty() || !index_.streams_with_unsafe().empty()) poll(false);
      req.reclaimed += reclaim(k - hs.size(), hs);
    };
    if (opts_.reclaim_before_create) {
      reclaim_more();
      create_more();
    } else {
      create_more();
      reclaim_more();
    }
    if (hs.size() < k) {
      // Last resort: wait for every stream's work on freed memory, then reclaim under it.
      flush_lifos();
      poll(true);
      req.waited = true;
      req.reclaimed += reclaim(k - hs.size(), hs);
    }
    if (hs.size() < k) {
      pool_.insert(pool_.end(), hs.begin(), hs.end());
      throw_oom(req);
    }
  } catch (const out_of_memory&) {
    throw;
  } catch (...) {
    pool_.insert(pool_.end(), hs.begin(), hs.end());
    throw;
  }

  // Map one handle per page, then grant access run by run (one cuMemSetAccess per run).
  size_t mapped = 0;
  try {
    for (; mapped < k; ++mapped) {
      drv_.map(r.page_addr(need[mapped]), page_, hs[mapped]);
      r.handles[need[mapped]] = hs[mapped];
      ++r.mapped_pages;
      ++mapped_pages_;
    }
    for (size_t i = 0; i < k;) {
      size_t j = i + 1;
      while (j < k && need[j] == need[j - 1] + 1) ++j;
      drv_.set_access(r.page_addr(need[i]), (j - i) * page_);
      i = j;
    }
  } catch (...) {
    // Undo this call's mappings; a page whose unmap fails stays mapped (and cached), so the
    // books still match the driver.
    for (size_t i = 0; i < mapped; ++i) {
      try {
        drv_.unmap(r.page_addr(need[i]), page_);
      } catch (...) {
        continue;
      }
      r.handles[need[i]] = 0;
      --r.mapped_pages;
      --mapped_pages_;
      pool_.push_back(hs[i]);
    }
    pool_.insert(pool_.end(), hs.begin() + static_cast<std::ptrdiff_t>(mapped), hs.end());
    throw;
  }
  stats_.peak_mapped_bytes = std::max<uint64_t>(stats_.peak_mapped_bytes, mapped_pages_ * page_);
  stats_.peak_physical_bytes =
      std::max<uint64_t>(stats_.peak_physical_bytes, held_pages() * page_);
}

// Unmaps up to `want` mapped pages lying wholly under safe free blocks (large arena first, largest
// blocks first) and appends their handles to `out`. Contiguous pages go in one cuMemUnmap.
size_t DeviceAllocator::reclaim(size_t want, std::vector<CUmemGenericAllocationHandle>& out) {
  size_t got = 0;
  for (Arena a : {Arena::large, Arena::small}) {
    if (got >= want) break;
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      Reservation& r = res(it->second.res);
      size_t lo = 0, hi = 0;
      r.inner_pages(it->first, it->second.size, &lo, &hi);
      for (size_t p = lo; p < hi && got < want;) {
        if (!r.mapped(p)) {
          ++p;
          continue;
        }
        size_t q = p;
        while (q < hi && r.mapped(q) && (q - p) < want - got) ++q;
        drv_.unmap(r.page_addr(p), (q - p) * page_);
        for (size_t i = p; i < q; ++i) {
          out.push_back(r.handles[i]);
          r.handles[i] = 0;
        }
        r.mapped_pages -= q - p;
        mapped_pages_ -= q - p;
        got += q - p;
        p = q;
      }
      return got < want;
    });
  }
  stats_.num_reclaimed_pages += got;
  return got;
}

void DeviceAllocator::make_live(BlockIt it, size_t requested, CUstream stream) {
  Block& b = it->second;
  b.state = BlockState::live;
  b.requested = requested;
  b.stream = stream;
  b.safe = false;
  b.users.clear();
  Reservation& r = res(b.res);
  touched_pages_ += r.touch(it->first, b.size);
  stats_.requested_bytes += requested;
  stats_.allocated_bytes += b.size;
  ++stats_.live_blocks;
  ++stats_.num_allocs;
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

// ---- free ------------------------------------------------------------------------------------

void DeviceAllocator::deallocate(void* ptr, CUstream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  auto it = index_.blocks().find(addr);
  if (it == index_.blocks().end() || it->second.state != BlockState::live) {
    std::string what = it == index_.blocks().end() ? std::string() : "a block that is not live";
    throw usage_error("expanse: free of " + hex(addr) + " on device " + std::to_string(device()) +
                      ": " + (what.empty() ? describe_pointer(ptr) : what) +
                      " (double free, or not a pointer expanse returned); nothing was changed");
  }
  Block& b = it->second;
  // The free is ordered on `stream`; if the block was allocated on another stream, work there
  // may still use it too.
  std::vector<CUstream> users = b.users;
  if (stream != b.stream && std::find(users.begin(), users.end(), b.stream) == users.end()) {
    users.push_back(b.stream);
  }
  std::vector<CUevent> events;
  try {
    for (CUstream u : users) {
      CUevent e = get_event();
      events.push_back(e);
      drv_.event_record(e, u);
    }
  } catch (const driver::driver_error& e) {
    for (CUevent ev : events) put_event(ev);
    throw driver_failure("expanse: free of " + hex(addr) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }

  Reservation& r = res(b.res);
  touched_pages_ -= r.untouch(it->first, b.size);
  stats_.requested_bytes -= b.requested;
  stats_.allocated_bytes -= b.size;
  --stats_.live_blocks;
  ++stats_.num_frees;

  StreamState& ss = stream_state(stream);
  b.stream = stream;
  b.seq = ++ss.free_seq;
  b.safe = false;
  b.users.clear();
  b.requested = 0;
  if (!events.empty()) {
    b.state = BlockState::pending;
    b.events = std::move(events);
    pending_.push_back(it);
  } else {
    b.state = BlockState::cached;
    ss.lifo.push_back(it);
    if (ss.lifo.size() > opts_.lifo_depth) flush_lifo_entry(ss, 0);
  }

  if (opts_.release_threshold != kNoLimit) {
    size_t cached_pages = mapped_pages_ - touched_pages_ + pool_.size();
    if (cached_pages * page_ > opts_.release_threshold) {
      try {
        trim_to(touched_pages_ + opts_.release_threshold / page_, false);
      } catch (...) {
        // Giving memory back is best effort; the free itself has happened.
      }
    }
  }
}

void DeviceAllocator::flush_lifo_entry(StreamState& ss, size_t i) {
  BlockIt it = ss.lifo[i];
  ss.lifo.erase(ss.lifo.begin() + static_cast<std::ptrdiff_t>(i));
  index_.insert_free(it, res(it->second.res).arena);
}

void DeviceAllocator::flush_lifos() {
  for (auto& [s, ss] : streams_) {
    while (!ss.lifo.empty()) flush_lifo_entry(ss, ss.lifo.size() - 1);
  }
}

void DeviceAllocator::record_stream(void* ptr, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  auto it = index_.blocks().find(addr);
  if (it == index_.blocks().end() || it->second.state != BlockState::live) {
    throw usage_error("expanse: record_stream of " + hex(addr) + " on device " +
                      std::to_string(device()) + ": " + describe_pointer(ptr) +
                      "; nothing was changed");
  }
  Block& b = it->second;
  if (stream == b.stream) return;
  if (std::find(b.users.begin(), b.users.end(), stream) == b.users.end()) {
    b.users.push_back(stream);
  }
}

// ---- streams: fences and pending blocks -----------------------------------------------------

CUevent DeviceAllocator::get_event() {
  if (!event_pool_.empty()) {
    CUevent e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  CUevent e = drv_.event_create();
  all_events_.push_back(e);
  return e;
}

void DeviceAllocator::put_event(CUevent e) { event_pool_.push_back(e); }

// Makes freed memory whose streams' work has completed safe for every stream. With wait, blocks
// until all such work is done (every unsafe free block becomes safe).
void DeviceAllocator::poll(bool wait) {
  for (size_t i = 0; i < pending_.size();) {
    Block& b = pending_[i]->second;
    bool done = true;
    while (!b.events.empty()) {
      CUevent e = b.events.back();
      if (wait) {
        drv_.event_synchronize(e);
      } else if (!drv_.event_query(e)) {
        done = false;
        break;
      }
      put_event(e);
      b.events.pop_back();
    }
    if (!done) {
      ++i;
      continue;
    }
    BlockIt it = pending_[i];
    pending_[i] = pending_.back();
    pending_.pop_back();
    index_.insert_free(it, res(it->second.res).arena);
  }

  for (CUstream s : index_.streams_with_unsafe()) {
    StreamState& ss = stream_state(s);
    if (ss.safe_seq < ss.free_seq && (ss.fences.empty() || ss.fences.back().seq < ss.free_seq)) {
      CUevent e = get_event();
      try {
        drv_.event_record(e, s);
      } catch (...) {
        put_event(e);
        throw;
      }
      ss.fences.push_back({e, ss.free_seq});
    }
    while (!ss.fences.empty()) {
      Fence f = ss.fences.front();
      if (wait) {
        drv_.event_synchronize(f.event);
      } else if (!drv_.event_query(f.event)) {
        break;
      }
      ss.safe_seq = std::max(ss.safe_seq, f.seq);
      put_event(f.event);
      ss.fences.pop_front();
    }
    for (Arena a : {Arena::small, Arena::large}) {
      for (BlockIt it : index_.owned_up_to(a, s, ss.safe_seq)) index_.make_safe(it, a);
    }
  }
}

// ---- giving memory back ---------------------------------------------------------------------

// Releases pooled pages, then reclaims and releases cached pages, until at most max_held pages are
// held. Only safe free memory is touched.
void DeviceAllocator::trim_to(size_t max_held, bool release_reservations) {
  while (held_pages() > max_held && !pool_.empty()) {
    drv_.release(pool_.back());
    pool_.pop_back();
    ++stats_.num_released_pages;
  }
  if (held_pages() > max_held) {
    std::vector<CUmemGenericAllocationHandle> hs;
    try {
      reclaim(held_pages() - max_held, hs);
    } catch (...) {
      pool_.insert(pool_.end(), hs.begin(), hs.end());
      throw;
    }
    stats_.num_reclaimed_pages -= hs.size();  // released, not reused elsewhere
    while (!hs.empty()) {
      try {
        drv_.release(hs.back());
      } catch (...) {
        pool_.insert(pool_.end(), hs.begin(), hs.end());
        throw;
      }
      hs.pop_back();
      ++stats_.num_released_pages;
    }
  }
  if (release_reservations) release_empty_reservations();
}

void DeviceAllocator::release_empty_reservations() {
  for (auto& rp : reservations_) {
    if (!rp || !rp->alive || rp->live_blocks != 0 || rp->mapped_pages != 0) continue;
    auto it = index_.blocks().find(rp->base);
    if (it == index_.blocks().end() || it->second.size != rp->size ||
        it->second.state != BlockState::free || !it->second.safe) {
      continue;
    }
    drv_.address_free(rp->base, rp->size);
    index_.remove_reservation(*rp);
    va_reserved_ -= rp->size;
    rp->alive = false;
  }
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    flush_lifos();
    poll(true);
    trim_to(touched_pages_, true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(std::string("expanse: release_cached on device ") +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_pages_ = bytes == kNoLimit ? SIZE_MAX : bytes / page_;
  if (held_pages() > limit_pages_) {
    try {
      flush_lifos();
      poll(false);
      trim_to(std::max(limit_pages_, touched_pages_), false);
    } catch (const driver::driver_error& e) {
      throw driver_failure(std::string("expanse: set_limit on device ") +
                               std::to_string(device()) + ": " + e.what(),
                           static_cast<int>(e.code()));
    }
  }
}

size_t DeviceAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_pages_ == SIZE_MAX ? kNoLimit : limit_pages_ * page_;
}

// ---- introspection --------------------------------------------------------------------------

bool DeviceAllocator::owns(const void* ptr, size_t* size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.blocks().find(reinterpret_cast<CUdeviceptr>(ptr));
  if (it == index_.blocks().end() || it->second.state != BlockState::live) return false;
  if (size != nullptr) *size = it->second.requested;
  return true;
}

std::string DeviceAllocator::describe_pointer(const void* ptr) const {
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  const auto& blocks = index_.blocks();
  auto it = blocks.upper_bound(addr);
  if (it == blocks.begin()) return "not a pointer expanse returned on device " + std::to_string(device());
  --it;
  if (addr >= it->first + it->second.size) {
    return "not a pointer expanse returned on device " + std::to_string(device());
  }
  const Block& b = it->second;
  if (b.state == BlockState::live) {
    if (it->first == addr) return "live block of " + std::to_string(b.requested) + " bytes";
    return "interior pointer, " + std::to_string(addr - it->first) + " bytes into the live block " +
           hex(it->first) + " of " + std::to_string(b.requested) + " bytes";
  }
  return "free memory (already freed, or never allocated)";
}

[[noreturn]] void DeviceAllocator::throw_oom(const PageRequest& req) {
  size_t reclaimable = 0;
  for (Arena a : {Arena::large, Arena::small}) {
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      const Reservation& r = res(it->second.res);
      size_t lo = 0, hi = 0;
      r.inner_pages(it->first, it->second.size, &lo, &hi);
      for (size_t p = lo; p < hi; ++p) reclaimable += r.mapped(p) ? 1 : 0;
      return true;
    });
  }
  std::ostringstream m;
  m << "expanse: out of memory on device " << device() << ": ";
  m << "asked for " << conf::format_size(req.bytes) << " (" << req.bytes << " bytes) on stream "
    << stream_name(req.stream);
  if (req.needed != 0) {
    m << ", which needs " << req.needed << " more page" << (req.needed == 1 ? "" : "s") << " of "
      << conf::format_size(page_);
  }
  m << "; capacity " << conf::format_size(drv_.total_memory()) << ", live "
    << conf::format_size(stats_.allocated_bytes) << " (pages touched "
    << conf::format_size(touched_pages_ * page_) << "), cached "
    << conf::format_size((mapped_pages_ - touched_pages_) * page_) << ", reclaimable now "
    << conf::format_size(reclaimable * page_) << ", pooled "
    << conf::format_size(pool_.size() * page_) << ", limit "
    << (limit_pages_ == SIZE_MAX ? std::string("none") : conf::format_size(limit_pages_ * page_))
    << "; tried: pool (" << req.from_pool << " pages), reclaim (" << req.reclaimed
    << " pages), cuMemCreate (" << req.created << " pages"
    << (req.create_oom ? ", then CUDA_ERROR_OUT_OF_MEMORY" : "")
    << (req.limit_hit ? ", stopped at the limit" : "") << ")"
    << (req.waited ? ", waited for all streams' freed memory" : "")
    << (req.va_exhausted ? "; VA budget of " + conf::format_size(va_budget_) + " exhausted" : "");
  throw out_of_memory(m.str(), req.bytes, device());
}

DeviceStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceStats s = stats_;
  s.touched_bytes = touched_pages_ * page_;
  s.mapped_bytes = mapped_pages_ * page_;
  s.cached_bytes = (mapped_pages_ - touched_pages_) * page_;
  s.pooled_bytes = pool_.size() * page_;
  s.physical_bytes = held_pages() * page_;
  s.va_reserved_bytes = va_reserved_;
  s.driver_calls = drv_.calls();
  s.modeled_driver_ns = drv_.modeled_ns();
  return s;
}

void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_requested_bytes = stats_.requested_bytes;
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_mapped_bytes = mapped_pages_ * page_;
  stats_.peak_physical_bytes = held_pages() * page_;
  stats_.peak_va_reserved_bytes = va_reserved_;
}

std::string DeviceAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream err;
  size_t touched = 0, mapped = 0, free_indexed = 0;
  const auto& blocks = index_.blocks();
  for (const auto& rp : reservations_) {
    if (!rp || !rp->alive) continue;
    const Reservation& r = *rp;
    std::vector<uint32_t> edges(r.page_count(), 0);
    std::vector<char> interior(r.page_count(), 0);
    CUdeviceptr at = r.base;
    auto it = blocks.find(r.base);
    const Block* prev = nullptr;
    while (at < r.base + r.size) {
      if (it == blocks.end() || it->first != at) {
        err << "reservation " << hex(r.base) << ": no block at " << hex(at);
        return err.str();
      }
      const Block& b = it->second;
      if (b.res != r.id || b.size == 0 || b.size % kBlockAlignment != 0) {
        err << "block " << hex(it->first) << " has bad size or reservation";
        return err.str();
      }
      if (b.state == BlockState::free) {
        ++free_indexed;
        if (prev != nullptr && prev->state == BlockState::free &&
            (prev->safe || b.safe || prev->stream == b.stream)) {
          err << "free blocks at " << hex(it->first) << " and before it were not coalesced";
          return err.str();
        }
      }
      if (b.state == BlockState::live) {
        size_t a = r.first_page(it->first), z = r.last_page(it->first, b.size);
        ++edges[a];
        if (z != a) ++edges[z];
        for (size_t p = a + 1; p < z; ++p) interior[p] = 1;
        for (size_t p = a; p <= z; ++p) {
          if (!r.mapped(p)) {
            err << "live block " << hex(it->first) << " has unmapped page " << p;
            return err.str();
          }
        }
      }
      prev = &b;
      at += b.size;
      ++it;
    }
    for (size_t p = 0; p < r.page_count(); ++p) {
      if (edges[p] != r.edge_refs[p]) {
        err << "reservation " << hex(r.base) << " page " << p << ": edge count " << r.edge_refs[p]
            << ", expected " << edges[p];
        return err.str();
      }
      if (edges[p] != 0 || interior[p] != 0) ++touched;
      if (r.mapped(p)) ++mapped;
    }
  }
  if (touched != touched_pages_) {
    err << "touched pages " << touched_pages_ << ", recomputed " << touched;
    return err.str();
  }
  if (mapped != mapped_pages_) {
    err << "mapped pages " << mapped_pages_ << ", recomputed " << mapped;
    return err.str();
  }
  if (free_indexed != index_.free_blocks()) {
    err << "free index holds " << index_.free_blocks() << " blocks, map holds " << free_indexed;
    return err.str();
  }
  if (limit_pages_ != SIZE_MAX && held_pages() > std::max(limit_pages_, touched_pages_)) {
    // Allowed only transiently after a limit was lowered below what cannot be trimmed.
  }
  return "";
}

}  // namespace expanse::core
