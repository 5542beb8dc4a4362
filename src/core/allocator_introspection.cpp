// Looking inside: ownership queries, error descriptions, stats, and the invariant checker.
#include "core/allocator_internal.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace expanse::core {

// ---- introspection --------------------------------------------------------------------------

bool DeviceAllocator::owns(const void* ptr, size_t* size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.blocks().find(reinterpret_cast<CUdeviceptr>(ptr));
  if (it == index_.blocks().end() || it->second.state != BlockState::live) return false;
  if (size != nullptr) *size = it->second.requested;
  return true;
}

std::string DeviceAllocator::describe_pointer_locked(const void* ptr) const {
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

std::string DeviceAllocator::describe_stream_order(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  const auto& blocks = index_.blocks();
  auto it = blocks.upper_bound(addr);
  if (it != blocks.begin()) {
    --it;
    const Block& b = it->second;
    out << "block " << hex(it->first) << " +" << b.size << ": state " << static_cast<int>(b.state)
        << (b.safe ? " safe" : " unsafe") << ", stream key " << b.stream << ", seq " << b.seq
        << ", users";
    for (StreamKey u : b.users) out << ' ' << u;
    out << '\n';
  }
  for (const auto& [key, ss] : streams_) {
    out << "stream key " << key << ": kind " << static_cast<int>(ss.kind) << ", id " << ss.id
        << ", handle " << ss.handle << ", ctx " << ss.ctx << ", owner thread " << ss.owner_thread
        << (ss.gone ? ", gone" : "") << ", live refs " << ss.live_refs << ", free seq "
        << ss.free_seq << ", safe seq " << ss.safe_seq << ", recent places " << ss.recent.size()
        << ", fences";
    for (const Fence& f : ss.fences) out << " (event " << f.event << ", seq " << f.seq << ")";
    out << '\n';
  }
  for (const Pending& p : pending_) {
    out << "pending " << hex(p.it->first) << " +" << p.it->second.size << " owner "
        << p.it->second.stream << " seq " << p.it->second.seq << ", waits for";
    for (const auto& [k, seq] : p.deps) out << " (key " << k << ", seq " << seq << ")";
    out << '\n';
  }
  return out.str();
}

[[noreturn]] void DeviceAllocator::throw_oom(const PageRequest& req) {
  size_t reclaimable = 0;
  for (Arena a : {Arena::large, Arena::small}) {
    index_.for_each_safe_largest_first(a, [&](BlockIt it) {
      const Reservation& r = res(it->second.res);
      size_t lo = 0, hi = 0;
      r.inner_pages(it->first, it->second.size, &lo, &hi);
      for (size_t p = lo; p < hi; ++p) {
        reclaimable += r.mapped(p) && r.handle_head(p) >= lo &&
                       r.handle_head(p) + r.handle_pages(p) <= hi;
      }
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
    << conf::format_size(pool_pages_ * page_) << ", limit "
    << (limit_pages_ == SIZE_MAX ? std::string("none") : conf::format_size(limit_pages_ * page_))
    << "; " << (req.hopeless ? "nothing tried: the pages do not exist (" +
                                    std::to_string(pages_left()) + " pages of " +
                                    conf::format_size(page_) + " left)" : "tried")
    << ": pool (" << req.from_pool << " pages), reclaim (" << req.reclaimed
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
  s.pooled_bytes = pool_pages_ * page_;
  s.physical_bytes = held_pages() * page_;
  s.va_reserved_bytes = va_reserved_;
  s.driver_calls = drv_.calls();
  s.modeled_driver_ns = drv_.modeled_ns();
  s.stream_queries = drv_.stream_queries();
  s.tracked_streams = streams_.size();
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
        if (prev != nullptr && index_.mergeable(*prev, b)) {
          err << "free blocks at " << hex(it->first) << " and before it were not coalesced";
          return err.str();
        }
      }
      if (b.state == BlockState::live) {
        size_t a = r.first_page(it->first), z = r.last_page(it->first, b.size);
        ++edges[a];
        if (z != a) ++edges[z];
        for (size_t p = a + 1; p < z; ++p) interior[p] = 1;
        size_t lo = 0, hi = 0;
        r.inner_pages(it->first, b.size, &lo, &hi);
        for (size_t p = a; p <= z; ++p) {
          if (!r.ready(p)) {
            err << "live block " << hex(it->first) << " has an unmapped or inaccessible page " << p;
            return err.str();
          }
          const size_t head = r.handle_head(p), n = r.handle_pages(p);
          if (n > 1 && (head < lo || head + n > hi)) {
            err << "live block " << hex(it->first) << " covers part of the " << n
                << "-page handle at page " << head << " (or shares it on an edge page)";
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
      if (r.mapped(p)) {
        ++mapped;
        const size_t head = r.handle_head(p);
        if (head + r.handle_pages(p) > r.page_count() || r.handles[head] != r.handles[p] ||
            r.span[head] != r.span[p] || r.head[head] != head ||
            r.granted[head] != r.granted[p]) {
          err << "reservation " << hex(r.base) << " page " << p << ": not part of one whole "
              << r.handle_pages(p) << "-page handle";
          return err.str();
        }
      }
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

// ---- memory history ---------------------------------------------------------------------------

namespace expanse::core {

void DeviceAllocator::set_events(AllocatorEvents* e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_ = e;
}

std::vector<SegmentView> DeviceAllocator::segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SegmentView> out;
  const auto& blocks = index_.blocks();
  for (const auto& rp : reservations_) {
    if (!rp || !rp->alive) continue;
    const Reservation& r = *rp;
    for (size_t p = 0; p < r.page_count();) {
      if (!r.mapped(p)) {
        ++p;
        continue;
      }
      size_t q = p;
      while (q < r.page_count() && r.mapped(q)) ++q;
      SegmentView seg;
      seg.address = r.page_addr(p);
      seg.size = (q - p) * page_;
      seg.small_arena = r.arena == Arena::small;
      const CUdeviceptr end = seg.address + seg.size;
      auto it = blocks.upper_bound(seg.address);
      --it;  // every byte of a reservation belongs to a block, so one starts at or before
      for (; it != blocks.end() && it->first < end; ++it) {
        const Block& b = it->second;
        BlockView v;
        v.address = std::max(it->first, seg.address);
        v.size = static_cast<size_t>(std::min(it->first + b.size, end) - v.address);
        if (b.state == BlockState::live) {
          v.state = BlockView::State::live;
          v.requested = b.requested;
        } else if (b.state == BlockState::pending) {
          v.state = BlockView::State::awaiting_free;
        }
        seg.blocks.push_back(v);
      }
      out.push_back(std::move(seg));
      p = q;
    }
  }
  return out;
}

}  // namespace expanse::core
