#include "core/streams/stream_order.hpp"

#include "core/streams/capture_announcements.hpp"
#include "core/base/check.hpp"
#include "core/base/format.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <atomic>
#include <string>

namespace expanse::core {

uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

namespace {

// What fences of a stream of this kind are recorded on: the legacy stream for legacy keys (which
// stand for NULL and CU_STREAM_LEGACY alike), the calling thread's per-thread stream, else s.
CUstream handle_for(StreamIdentity::Kind kind, CUstream s) {
  return kind == StreamIdentity::legacy       ? CU_STREAM_LEGACY
         : kind == StreamIdentity::per_thread ? CU_STREAM_PER_THREAD
                                              : s;
}

}  // namespace

StreamIdentity StreamOrder::identify(CUstream s, const char* what, const void* ptr) {
  try {
    // Code built with --default-stream per-thread means its per-thread stream by NULL.
    if (s == nullptr && opts_.null_stream_per_thread) return drv_.identify(CU_STREAM_PER_THREAD);
    return drv_.identify(s);
  } catch (const driver::driver_error& e) {
    throw usage_error("expanse: " + std::string(what) +
                      (ptr != nullptr ? " of " + hex(reinterpret_cast<CUdeviceptr>(ptr)) : "") +
                      " on device " + std::to_string(drv_.device()) + ": " + e.what() +
                      "; nothing was changed");
  }
}

StreamKey StreamOrder::key_for(const StreamIdentity& id) {
  switch (id.kind) {
    case StreamIdentity::created:
    case StreamIdentity::per_thread:
    case StreamIdentity::legacy:
      return id.id;
    case StreamIdentity::unknown:
      return next_key_++;
    case StreamIdentity::capturing:
      // One state per capture sequence (its id; stream ids and made-up keys stay below 2^62).
      return id.id != 0 ? (StreamKey{1} << 62) | id.id : next_key_++;
  }
  return 0;
}

StreamOrder::StreamState& StreamOrder::state(CUstream s, const StreamIdentity& id) {
  drv_.add_stream_queries(id.queries);
  const StreamKey key = key_for(id);
  current_ = key;
  if (id.kind == StreamIdentity::created) {
    // The handle now names this stream: a state that knew it under another id names a
    // destroyed stream (its value was recycled), and a capture begun on it is over.
    for (auto& [k, st] : streams_) {
      if (st.handle != s || k == key) continue;
      if (st.kind == StreamIdentity::created) st.gone = true;
      if (st.kind == StreamIdentity::capturing) st.capture_over = true;
    }
  }
  auto [it, added] = streams_.try_emplace(key);
  StreamState& ss = it->second;
  ss.last_used = ++use_clock_;
  if (!added) {
    ss.gone = false;  // the driver just named it again: its handle is valid
    ss.handle = handle_for(ss.kind, s);
    return ss;
  }
  ss.key = key;
  // New, or made again after drop_finished_states forgot it with every free proven.
  ss.free_seq = ss.safe_seq = seq_clock_;
  ss.kind = id.kind;
  ss.id = id.id;
  ss.handle = handle_for(id.kind, s);
  if (id.kind == StreamIdentity::per_thread || id.kind == StreamIdentity::unknown ||
      (id.kind == StreamIdentity::capturing && s == CU_STREAM_PER_THREAD)) {
    ss.owner_thread = this_thread_serial();
  }
  CUcontext ctx = nullptr;
  // A capturing stream is asked nothing more (cuStreamGetCtx during capture is not known to be
  // legal): its context is the current one, or the primary.
  if (id.kind == StreamIdentity::capturing) {
    if (drv_.current_ctx(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  } else if (id.in_primary || drv_.stream_ctx(s, &ctx) != CUDA_SUCCESS) {
    ctx = nullptr;
  }
  ss.ctx = ctx != nullptr ? ctx : drv_.primary();
  return ss;
}

// ---- a block's life -------------------------------------------------------------------------

void StreamOrder::on_alloc(Block& b, StreamState& ss) {
  // Still the free memory's fields: safe memory another stream's free made so?
  if (!b.safe || b.freed_by == ss.key) b.freed_by = kNeverFreed;
  b.stream = ss.key;
  ++ss.live_refs;
  ss.live_bytes += b.size;
  if (placement_.arena_of(b) == Arena::large) {
    ++ss.large_refs;
    ss.large_bytes += b.size;
  }
  b.safe = false;
  b.users.clear();
}

void StreamOrder::add_user(Block& b, StreamState& ss) {
  if (ss.key == b.stream) return;
  if (std::find(b.users.begin(), b.users.end(), ss.key) == b.users.end()) {
    b.users.push_back(ss.key);
    ++ss.live_refs;
  }
}

// The free is ordered on ss; the allocation stream and streams recorded with record_stream may
// still use the block: it waits until each has passed this point (a fence recorded on it later
// covers it; nothing is recorded here).
// At most how many streams end_uses names: b's allocation stream and its users, but ss.
static size_t deps_of(const Block& b, const StreamOrder::StreamState& ss) {
  size_t n = b.stream != ss.key ? 1 : 0;
  for (StreamKey u : b.users) n += u != ss.key ? 1 : 0;
  return n;
}

StreamOrder::Deps StreamOrder::make_room_for_free(const Block& b, StreamState& ss) {
  Deps deps;
  if (const size_t n = deps_of(b, ss); n != 0) deps.reserve(n);
  if (pending_.size() == pending_.capacity()) {
    pending_.reserve(std::max<size_t>(16, 2 * pending_.capacity()));
  }
  if (ss.recent.capacity() < opts_.lifo_depth) ss.recent.reserve(opts_.lifo_depth);
  placement_.index().make_room(b.pool);
  // A free into a released pool lands in the default pool (DeviceAllocator::deallocate).
  if (b.pool != kDefaultPool) placement_.index().make_room(kDefaultPool);
  return deps;
}

StreamOrder::Deps StreamOrder::end_uses(const Block& b, StreamState& ss, Deps deps) {
  EXPANSE_ASSERT(deps.empty() && deps.capacity() >= deps_of(b, ss));
  const bool large = placement_.arena_of(b) == Arena::large;
  auto depend_on = [&](StreamKey k, size_t bytes) {
    auto st = streams_.find(k);
    if (st == streams_.end()) return;  // nothing of it left unproven (drop_finished_states)
    EXPANSE_ASSERT(st->second.live_refs > 0 && st->second.live_bytes >= bytes);
    --st->second.live_refs;
    st->second.live_bytes -= bytes;
    if (large && k == b.stream) {
      EXPANSE_ASSERT(st->second.large_refs > 0 && st->second.large_bytes >= bytes);
      --st->second.large_refs;
      st->second.large_bytes -= bytes;
    }
    if (k != ss.key) {
      deps.emplace_back(k, st->second.free_seq = ++seq_clock_);
      st->second.owes_fence = true;  // its next call proves its uses over
    }
  };
  depend_on(b.stream, b.size);
  for (StreamKey u : b.users) depend_on(u, 0);
  return deps;
}

void StreamOrder::on_free(BlockIt it, StreamState& ss, Deps deps) {
  Block& b = it->second;
  EXPANSE_ASSERT(b.state == BlockState::live);
  b.stream = ss.key;
  b.seq = ss.free_seq = ++seq_clock_;
  b.safe = false;
  b.users.clear();
  b.requested = 0;
  if (ss.kind == StreamIdentity::unknown) {
    // A driver without stream ids: this key never comes back, so the block is of use only once a
    // fence proves it done; the handle is valid now (the caller frees on it), so record it now.
    DeviceDriver::RelaxedCapture relaxed(drv_);
    record_fence(ss, /*at_free=*/true);
  }
  if (!deps.empty() || b.freed_by != kNeverFreed) {
    // Other streams used it, or freed it before, and may want it back: prove the free done
    // from here.
    wanted_.want(it->first, it->first + b.size, use_clock_);
    ss.owes_fence = true;
    fence_if_owed(ss);
  }
  if (!deps.empty()) {
    b.state = BlockState::pending;
    pending_.push_back({it, std::move(deps)});
    return;
  }
  // A driver without stream ids gives every call a new key: no place is worth remembering.
  if (ss.kind != StreamIdentity::unknown && opts_.lifo_depth != 0) {
    if (ss.recent.size() == opts_.lifo_depth) ss.recent.erase(ss.recent.begin());
    ss.recent.push_back({it->first, b.size});
  }
  free_to_index(ss, it);
}

void StreamOrder::free_to_index(StreamState& ss, BlockIt it) {
  const Arena a = placement_.arena_of(it->second);
  BlockIndex& index = placement_.index();
  it = index.insert_free(it, a);  // may merge with ss's other free blocks (seq: the largest)
  if (!it->second.safe && it->second.stream == ss.key && it->second.seq <= ss.safe_seq) {
    index.make_safe(it, a);  // a fence passed it already
    return;
  }
  // Memory another stream wanted: its next want is proven by a query if a fence is recorded now.
  if (!it->second.safe && wanted_.meets(it->first, it->first + it->second.size, use_clock_)) {
    ss.owes_fence = true;
    fence_if_owed(ss);
  }
}

// ---- diagnosis --------------------------------------------------------------------------------

void StreamOrder::describe(std::ostream& out) const {
  for (const auto& [key, ss] : streams_) {
    out << "stream key " << key << ": kind " << static_cast<int>(ss.kind) << ", id " << ss.id
        << ", handle " << ss.handle << ", ctx " << ss.ctx << ", owner thread " << ss.owner_thread
        << (ss.gone ? ", gone" : "") << ", live refs " << ss.live_refs << ", free seq "
        << ss.free_seq << ", safe seq " << ss.safe_seq << ", recent places " << ss.recent.size()
        << (ss.owes_fence ? ", owes a fence" : "") << ", fences";
    for (const Fence& f : ss.fences) out << " (event " << f.event << ", seq " << f.seq << ")";
    out << '\n';
  }
  if (!wanted_.empty()) out << "wanted ranges: " << wanted_.size() << '\n';
  for (const Pending& p : pending_) {
    out << "pending " << hex(p.it->first) << " +" << p.it->second.size << " owner "
        << p.it->second.stream << " seq " << p.it->second.seq << ", waits for";
    for (const auto& [k, seq] : p.deps) out << " (key " << k << ", seq " << seq << ")";
    out << '\n';
  }
}

}  // namespace expanse::core
