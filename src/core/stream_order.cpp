// Stream-ordered reuse (DESIGN.md invariant 3): per-stream LIFOs, record_stream, fences that make
// freed memory safe for every stream, and blocks pending on other streams' events.
#include "core/allocator_internal.hpp"
#include "driver/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cassert>

namespace expanse::core {

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
                      std::to_string(device()) + ": " + describe_pointer_locked(ptr) +
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
      bool recorded = false;
      try {
        recorded = drv_.event_record_or_synchronize(e, s);
      } catch (...) {
        put_event(e);
        throw;
      }
      if (!recorded) {
        put_event(e);
        forget_stream(s);  // destroyed; the device has been synchronized
        continue;
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

// A stream that no longer exists, after the device was synchronized: everything freed on it is
// safe, and its state goes (a new stream may get the same handle).
void DeviceAllocator::forget_stream(CUstream s) {
  auto found = streams_.find(s);
  if (found != streams_.end()) {
    StreamState& ss = found->second;
    while (!ss.lifo.empty()) flush_lifo_entry(ss, ss.lifo.size() - 1);
    for (const Fence& f : ss.fences) put_event(f.event);
    streams_.erase(found);
  }
  for (Arena a : {Arena::small, Arena::large}) {
    for (BlockIt it : index_.owned_up_to(a, s, UINT64_MAX)) index_.make_safe(it, a);
  }
}

}  // namespace expanse::core
