// DeviceAllocator, looking inside: ownership queries, error descriptions, stats, the invariant
// check and the memory history's view of segments.
#include "core/device_allocator.hpp"

#include "core/base/format.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <sstream>

namespace expanse::core {

bool DeviceAllocator::owns(const void* ptr, size_t* size) const {
  // A block that passed through a thread cache is known without the lock (expanse_torch_free
  // asks before every free).
  const int front = caches_.blocks().user_holds(reinterpret_cast<CUdeviceptr>(ptr), size);
  if (front >= 0) return front == 1;
  std::lock_guard<std::mutex> lock(mu_);
  if (const RegistrableBlock* rb = registrable_.find(reinterpret_cast<CUdeviceptr>(ptr))) {
    if (size != nullptr) *size = rb->requested;
    return true;
  }
  const auto& blocks = placement_.index().blocks();
  auto it = blocks.find(reinterpret_cast<CUdeviceptr>(ptr));
  if (it == blocks.end() ||
      (it->second.state != BlockState::live && it->second.state != BlockState::asleep)) {
    return false;
  }
  if (parked_locked(it->first)) return false;  // freed: a thread cache holds it
  if (size != nullptr) *size = it->second.requested;
  return true;
}

std::string DeviceAllocator::describe_pointer_locked(const void* ptr) const {
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  const auto& blocks = placement_.index().blocks();
  auto it = blocks.upper_bound(addr);
  const std::string foreign =
      "not a pointer expanse returned on device " + std::to_string(device());
  if (it == blocks.begin()) return foreign;
  --it;
  if (addr >= it->first + it->second.size) return foreign;
  const Block& b = it->second;
  if (b.state == BlockState::live && parked_locked(it->first)) {
    return "freed memory (a thread cache holds it for reuse)";
  }
  if (b.state == BlockState::live) {
    if (it->first == addr) return "live block of " + std::to_string(b.requested) + " bytes";
    return "interior pointer, " + std::to_string(addr - it->first) + " bytes into the live block " +
           hex(it->first) + " of " + std::to_string(b.requested) + " bytes";
  }
  if (b.state == BlockState::asleep) {
    return "a block of pool " + std::to_string(pools_.at(b.pool).id) +
           ", which is asleep (its pages were given back; wake the pool first)";
  }
  return "free memory (already freed, or never allocated)";
}

std::string DeviceAllocator::describe_stream_order(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  const auto& blocks = placement_.index().blocks();
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
  streams_.describe(out);
  return out.str();
}

[[noreturn]] void DeviceAllocator::throw_oom(const PageRequest& req) {
  size_t reclaimable = 0;
  for (const ReclaimableHandle& h : placement_.reclaimable_handles()) reclaimable += h.pages;
  const size_t touched = supply_.touched_pages(), limit = supply_.limit_pages();
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
    << conf::format_size(touched * page_) << "), cached "
    << conf::format_size((supply_.mapped_pages() - touched) * page_) << ", reclaimable now "
    << conf::format_size(reclaimable * page_) << ", pooled "
    << conf::format_size(supply_.pooled_pages() * page_) << ", limit "
    << (limit == SIZE_MAX ? std::string("none") : conf::format_size(limit * page_)) << "; "
    << (req.hopeless ? "nothing tried: the pages do not exist (" +
                           std::to_string(supply_.pages_left()) + " pages of " +
                           conf::format_size(page_) + " left)"
                     : "tried")
    << ": pool (" << req.from_pool << " pages), reclaim (" << req.reclaimed
    << " pages), cuMemCreate (" << req.created << " pages"
    << (req.create_oom ? ", then CUDA_ERROR_OUT_OF_MEMORY" : "")
    << (req.limit_hit ? ", stopped at the limit" : "") << ")"
    << (req.waited ? ", waited for all streams' freed memory" : "")
    << (req.va_exhausted ? "; VA budget of " + conf::format_size(placement_.va_budget()) +
                               " exhausted"
                         : "")
    << pools_holding_memory();
  throw out_of_memory(m.str(), req.bytes, device());
}

bool DeviceAllocator::parked_locked(CUdeviceptr addr) const {
  const FrontBlocks::Entry* e = caches_.blocks().find(addr);
  return e != nullptr && e->state.load(std::memory_order_acquire) == FrontBlocks::cached;
}

DeviceStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Every figure as users see it: parked blocks are freed. They stay parked (a client reading
  // its stats every step keeps its cache hits); the counts the caches kept are absorbed, which
  // changes nothing users see (the allocator itself is never const).
  const ParkedShare parked = const_cast<DeviceAllocator*>(this)->parked_share_locked();
  DeviceStats s = stats_;
  s.requested_bytes -= parked.requested;
  s.allocated_bytes -= parked.bytes;
  s.live_blocks -= parked.blocks;
  s.num_frees += parked.blocks;
  const size_t touched = supply_.touched_pages() - parked.pages;
  s.touched_bytes = touched * page_ + registrable_.bytes();
  s.mapped_bytes = supply_.mapped_pages() * page_ + registrable_.bytes();
  s.cached_bytes = (supply_.mapped_pages() - touched) * page_;
  s.pooled_bytes = supply_.pooled_pages() * page_;
  s.physical_bytes = supply_.held_pages() * page_;
  s.va_reserved_bytes = placement_.va_reserved() + registrable_.bytes() + imports_.bytes();
  s.reserved_bytes = supply_.reserved_pages() * page_;
  s.reserved_unused_bytes = supply_.reserved_unused_pages(parked.pages) * page_;
  s.reserve_asked_bytes = supply_.reserve_asked_pages() * page_;
  // Counted at the driver calls themselves (DeviceDriver::held_bytes): registrable blocks
  // included, imports (another process's memory) not.
  s.physical_low_water_bytes = drv_.low_water_bytes();
  s.reserve_stranded_bytes = (stranded_pages_ + supply_.retired_pages()) * page_;
  s.driver_calls = drv_.calls();
  s.modeled_driver_ns = drv_.modeled_ns();
  s.stream_queries = drv_.stream_queries();
  s.tracked_streams = streams_.tracked_streams();
  return s;
}

void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  // Every thread's peak credit from 0 in the pass that reads what it parked (users hold the rest).
  const ParkedShare parked = parked_share_locked(/*zero_credits=*/true);
  stats_.peak_requested_bytes = stats_.requested_bytes - parked.requested;
  stats_.peak_allocated_bytes = stats_.allocated_bytes - parked.bytes;
  stats_.peak_mapped_bytes = supply_.mapped_pages() * page_ + registrable_.bytes();
  stats_.peak_physical_bytes = supply_.held_pages() * page_;
  stats_.peak_va_reserved_bytes =
      placement_.va_reserved() + registrable_.bytes() + imports_.bytes();
}

std::string DeviceAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return check_invariants_locked();
}

std::string DeviceAllocator::check_invariants_locked() const {
  size_t touched = 0, mapped = 0, free_blocks = 0;
  std::string err = placement_.check(&touched, &mapped, &free_blocks);
  if (!err.empty()) return err;
  if (touched != supply_.touched_pages()) {
    return "touched pages " + std::to_string(supply_.touched_pages()) + ", recomputed " +
           std::to_string(touched);
  }
  if (mapped != supply_.mapped_pages()) {
    return "mapped pages " + std::to_string(supply_.mapped_pages()) + ", recomputed " +
           std::to_string(mapped);
  }
  if (free_blocks != placement_.index().free_blocks()) {
    return "free index holds " + std::to_string(placement_.index().free_blocks()) +
           " blocks, map holds " + std::to_string(free_blocks);
  }
  err = check_pools_locked();
  if (!err.empty()) return err;
  err = check_parked_locked();
  if (!err.empty()) return err;
  // Held pages may exceed the limit only transiently, after a limit was lowered below what
  // cannot be trimmed: no check.
  return "";
}

// Every block in a thread cache is live in the books, and its front entry says a cache holds it.
std::string DeviceAllocator::check_parked_locked() const {
  std::string err;
  const_cast<ThreadCaches&>(caches_).for_each([&](ThreadCache& c) {
    std::lock_guard<SpinLock> lock(c.lock);
    c.for_each_block([&](const CachedBlock& cb) {
      if (!err.empty()) return;
      auto it = placement_.index().blocks().find(cb.addr);
      const FrontBlocks::Entry* e = caches_.blocks().find(cb.addr);
      if (it == placement_.index().blocks().end() || it->second.state != BlockState::live) {
        err = "parked block " + hex(cb.addr) + " is not live in the books";
      } else if (e == nullptr) {
        err = "parked block " + hex(cb.addr) + " has no front entry";
      } else if (e->state.load(std::memory_order_acquire) != FrontBlocks::cached) {
        err = "parked block " + hex(cb.addr) + "'s front entry says the user holds it";
      }
    });
  });
  return err;
}

// ---- memory history ---------------------------------------------------------------------------

void DeviceAllocator::set_events(AllocatorEvents* e) {
  std::lock_guard<std::mutex> lock(mu_);
  // The history sees every allocation and free when it happens: no caches while it records.
  history_on_.store(e != nullptr, std::memory_order_release);
  flush_caches_locked();
  events_ = e;
  supply_.set_events(e);
}

std::vector<SegmentView> DeviceAllocator::segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Parked blocks back in the books first: the segments show them free, as users see them.
  const_cast<DeviceAllocator*>(this)->flush_caches_locked();
  std::vector<SegmentView> out;
  const auto& blocks = placement_.index().blocks();
  placement_.for_each_reservation([&](const Reservation& r) {
    // A segment: a run of mapped pages [p, q).
    auto add = [&](size_t p, size_t q) {
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
        // A block out of its cache on its way back to the books (evicted by a park on another
        // thread, or owed for want of host memory) was freed as users see it, as parked ones.
        if (b.state == BlockState::live && !parked_locked(it->first)) {
          v.state = BlockView::State::live;
          v.requested = b.requested;
        } else if (b.state == BlockState::pending) {
          v.state = BlockView::State::awaiting_free;
        }
        seg.blocks.push_back(v);
      }
      out.push_back(std::move(seg));
    };
    size_t p = 0, q = 0;  // the run of mapped pages so far
    for (const HandleRun& h : r.handles_in(0, r.page_count())) {
      if (h.head != q) {
        if (q > p) add(p, q);
        p = h.head;
      }
      q = h.end();
    }
    if (q > p) add(p, q);
  });
  return out;
}

}  // namespace expanse::core
