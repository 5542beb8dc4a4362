// StreamOrder's proofs: fences recorded after frees, their completion, context syncs, and what
// they make safe.
#include "core/streams/capture_announcements.hpp"
#include "core/base/check.hpp"
#include "core/streams/stream_order.hpp"

#include <algorithm>
#include <new>

namespace expanse::core {

// Whether no capture is known to be under way in ctx (a legacy-stream record or a context sync
// would implicitly synchronize with it, which invalidates the capture). Asks only what is safe to
// ask: the current call's stream and ctx's legacy stream (which answers IMPLICIT while a blocking
// stream of ctx captures); a capture seen by an earlier call counts as under way until a later
// call finds its stream not capturing. A capture on a non-blocking stream expanse never saw
// cannot be detected (no legal question finds it).
bool StreamOrder::context_quiet(CUcontext ctx) {
  for (auto& [k, st] : streams_) {
    if (st.ctx == ctx && st.kind == StreamIdentity::capturing && !st.capture_over) return false;
  }
  DeviceDriver::ScopedContext scope(drv_, ctx);
  if (!scope.ok() || !drv_.surely_not_capturing(CU_STREAM_LEGACY)) return false;
  auto cur = streams_.find(current_);
  if (cur != streams_.end() && cur->second.ctx == ctx &&
      cur->second.kind != StreamIdentity::legacy &&
      (cur->second.owner_thread == 0 || cur->second.owner_thread == this_thread_serial()) &&
      !drv_.surely_not_capturing(cur->second.handle)) {
    return false;
  }
  return true;
}

// Runs op (an operation that waits for every stream of ctx: a context sync, a record on the
// legacy stream) unless a capture is known to be under way in ctx or the application announced
// one; returns op's result, or false when it did not run.
bool StreamOrder::run_context_wide(CUcontext ctx, const std::function<bool()>& op) {
  return context_quiet(ctx) && CaptureAnnouncements::run_unless_capturing(ctx, op);
}

// Records a fence after ss's latest free. not_now: it cannot be recorded from here or now
// (another thread's per-thread stream, a capture, a driver failure); gone: the handle no longer
// names ss (destroyed, perhaps recycled), so only a sync of ss.ctx covers its work.
// at_free: called by the thread freeing on ss's handle right now, which the caller promises is a
// valid stream (the only time an unknown stream's handle can be trusted).
StreamOrder::Recorded StreamOrder::record_fence(StreamState& ss, bool at_free) {
  // Out of host memory (an event, a fence's room): no fence, so nothing is proven by one; a
  // fence popped to be recorded again is lost, and its event stays out of the pool.
  try {
    return record_fence_or_throw(ss, at_free);
  } catch (const std::bad_alloc&) {
    return Recorded::not_now;
  }
}

StreamOrder::Recorded StreamOrder::record_fence_or_throw(StreamState& ss, bool at_free) {
  if (ss.gone) return Recorded::gone;
  if (ss.kind == StreamIdentity::unknown && !at_free) return Recorded::gone;  // cannot be checked
  // Only handles that cannot name a destroyed stream: the current call's (the caller vouches
  // for it, see Call), the legacy stream, and the calling thread's per-thread stream.
  if (ss.key != current_ && ss.kind != StreamIdentity::legacy &&
      ss.kind != StreamIdentity::per_thread) {
    return Recorded::not_now;
  }
  if (ss.kind == StreamIdentity::capturing) return Recorded::not_now;  // would be captured
  if (ss.kind == StreamIdentity::per_thread && thread_exiting_) return Recorded::not_now;
  if (ss.owner_thread != 0 && ss.owner_thread != this_thread_serial()) return Recorded::not_now;
  DeviceDriver::ScopedContext scope(drv_, ss.ctx);
  if (!scope.ok()) return Recorded::not_now;
  if (!drv_.surely_not_capturing(ss.handle)) return Recorded::not_now;
  // With two fences pending, the latest is recorded again at the new point (cuEventRecord
  // overwrites: the event then completes when the new point does): a stream keeps at most two,
  // the older fixed (so a busy stream still proves its older frees) and the latest moving on.
  CUevent e = nullptr;
  Fence latest{};
  if (ss.fences.size() >= 2) {
    latest = ss.fences.back();
    e = latest.event;
    ss.fences.pop_back();
  }
  auto record = [&] {
    if (e == nullptr) e = events_.get(ss.ctx);
    if (e == nullptr) return false;
    if (drv_.event_record(ss.ctx, e, ss.handle) == CUDA_SUCCESS) return true;
    events_.put(ss.ctx, e);
    e = nullptr;
    return false;
  };
  // A record on the legacy stream waits for every blocking stream of the context: it is a
  // context-wide operation, like a context sync.
  if (!(ss.kind == StreamIdentity::legacy ? run_context_wide(ss.ctx, record) : record())) {
    // Not run (a capture in the context): the latest fence stands as it was. Refused by the
    // driver: the event went back to the pool (what it holds now is not known) and the fence
    // with it; the stream still owes one, recorded at a later call.
    if (e != nullptr) ss.fences.push_back(latest);
    return Recorded::not_now;
  }
  // A capture begun by another thread between the check and the record may have taken the
  // record into its graph; such an event must never be queried. It stays out of the pool.
  if (!drv_.surely_not_capturing(ss.handle)) return Recorded::not_now;
  EXPANSE_ASSERT(ss.fences.empty() || ss.fences.back().seq <= ss.free_seq);
  ss.fences.push_back({e, ss.ctx, ss.free_seq});
  return Recorded::yes;
}

// Synchronizes ctx (unless a known stream of it captures, or the application announced a
// capture in it) and marks every stream of it done up to now. Returns whether it did.
// A capture that another thread begins, unannounced, on a stream of ctx between these checks and
// the sync is invalidated by it: the driver gives no way to see it coming
// (capture_announcements.hpp).
bool StreamOrder::sync_context(CUcontext ctx) {
  sync_failure_ = CUDA_SUCCESS;
  if (!run_context_wide(ctx, [&] {
        sync_failure_ = drv_.ctx_synchronize(ctx);
        return sync_failure_ == CUDA_SUCCESS;
      })) {
    return false;
  }
  for (auto& [k, st] : streams_) {
    if (st.ctx != ctx) continue;
    st.safe_seq = st.free_seq;
    // One at a time: out of host memory in put, no event is both pooled and a fence.
    while (!st.fences.empty()) {
      events_.put(st.fences.front().ctx, st.fences.front().event);
      st.fences.pop_front();
    }
  }
  return true;
}

// Makes ss's frees up to safe_seq safe for every stream.
void StreamOrder::settle(StreamState& ss) {
  BlockIndex& index = placement_.index();
  for (Arena a : {Arena::small, Arena::large}) {
    for (BlockIt it : index.owned_up_to(a, ss.key, ss.safe_seq)) index.make_safe(it, a);
  }
}

void StreamOrder::poll(bool wait) {
  bool work = !pending_.empty();
  for (auto& [key, ss] : streams_) work = work || ss.safe_seq < ss.free_seq;
  if (!work) {  // nothing to record or query; blocks freed since may still be settled
    for (auto& [key, ss] : streams_) {
      if (ss.safe_seq > 0) settle(ss);
    }
    return;
  }
  prove(wait);
  for (auto& [key, ss] : streams_) {
    if (ss.safe_seq > 0) settle(ss);
  }
  release_pending();
  drop_finished_states();
}

void StreamOrder::prove(bool wait) {
  DeviceDriver::RelaxedCapture relaxed(drv_);
  std::vector<CUcontext> to_sync;
  for (auto& [key, ss] : streams_) {
    if (ss.safe_seq >= ss.free_seq) continue;
    if (ss.fences.empty() || ss.fences.back().seq < ss.free_seq) {
      if (record_fence(ss) != Recorded::yes && wait) to_sync.push_back(ss.ctx);
    }
    while (!ss.fences.empty()) {
      const CUevent e = ss.fences.front().event;
      const CUresult r = wait ? drv_.event_synchronize(e) : drv_.event_query(e);
      if (r != CUDA_SUCCESS) {  // not ready, or an error: not proven done
        if (wait) to_sync.push_back(ss.ctx);
        break;
      }
      retire_oldest_fence(ss);
    }
    EXPANSE_ASSERT(ss.safe_seq <= ss.free_seq);
  }
  std::sort(to_sync.begin(), to_sync.end());
  to_sync.erase(std::unique(to_sync.begin(), to_sync.end()), to_sync.end());
  for (CUcontext ctx : to_sync) sync_context(ctx);
}

bool StreamOrder::prove_own(StreamKey key) {
  StreamState* ss = find_state(key);
  if (ss == nullptr || ss->safe_seq >= ss->free_seq) return false;
  DeviceDriver::RelaxedCapture relaxed(drv_);
  if ((ss->fences.empty() || ss->fences.back().seq < ss->free_seq) &&
      record_fence(*ss) != Recorded::yes) {
    return false;
  }
  // In-stream order: the latest fence passing proves every earlier one.
  if (drv_.event_synchronize(ss->fences.back().event) != CUDA_SUCCESS) return false;
  while (!ss->fences.empty()) retire_oldest_fence(*ss);
  EXPANSE_ASSERT(ss->safe_seq <= ss->free_seq);
  settle(*ss);
  release_pending();
  return true;
}

void StreamOrder::retire_oldest_fence(StreamState& ss) {
  const Fence f = ss.fences.front();
  ss.safe_seq = std::max(ss.safe_seq, f.seq);
  events_.put(f.ctx, f.event);
  ss.fences.pop_front();
}

// Pending blocks whose streams have all passed their free go back to the free index.
void StreamOrder::release_pending() {
  BlockIndex& index = placement_.index();
  for (size_t i = 0; i < pending_.size();) {
    bool done = true;
    for (const auto& [key, seq] : pending_[i].deps) {
      auto st = streams_.find(key);
      if (st != streams_.end() && st->second.safe_seq < seq) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    BlockIt it = pending_[i].it;
    EXPANSE_ASSERT(it->second.state == BlockState::pending);
    // Out of host memory it throws here, the block still pending (a later poll settles it);
    // from here on indexing it allocates nothing.
    index.make_room(it->second.pool);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    ++pending_released_;
    const Arena a = placement_.arena_of(it->second);
    it = index.insert_free(it, a);  // may merge with its owner's other free blocks
    auto owner = streams_.find(it->second.stream);
    if (!it->second.safe &&
        (owner == streams_.end() || owner->second.safe_seq >= it->second.seq)) {
      index.make_safe(it, a);
    } else if (!it->second.safe &&
               wanted_.meets(it->first, it->first + it->second.size, use_clock_)) {
      // Wanted memory merged with later frees of its owner: their proof is owed too.
      owner->second.owes_fence = true;
    }
  }
}

// States nobody can name again (gone streams, one-call keys of a driver without ids, captures
// that are over) go once everything freed on them is proven and no live block refers to them.
// Streams that may be named again go too, least recently used first, once more than
// 2 x kKeptStreamStates are tracked, down to kKeptStreamStates: an application that creates and
// destroys streams (the driver not recycling the handle values) would otherwise grow the table
// forever. One named again after being forgotten costs one cuStreamGetCtx, and starts at "proven
// up to now" (seq_clock_), so what still refers to its key stays satisfied. A capture under way
// is never forgotten (context_quiet needs it), nor the state of the current call.
void StreamOrder::drop_finished_states() {
  constexpr size_t kKeptStreamStates = 64;
  auto holds_nothing = [](const StreamState& ss) {
    return ss.live_refs == 0 && ss.safe_seq == ss.free_seq && ss.fences.empty();
  };
  // Only a crowded table looks for named states to forget (no work per poll otherwise).
  const bool crowded = streams_.size() > 2 * kKeptStreamStates;
  std::vector<std::pair<uint64_t, StreamKey>> idle;  // (last_used, key) of named idle states
  for (auto it = streams_.begin(); it != streams_.end();) {
    StreamState& ss = it->second;
    const bool capturing = ss.kind == StreamIdentity::capturing && !ss.capture_over;
    const bool unnamed = ss.gone || ss.kind == StreamIdentity::unknown ||
                         (ss.kind == StreamIdentity::capturing && ss.capture_over);
    const bool movable = holds_nothing(ss) && it->first != in_use_ && it->first != current_;
    if (unnamed && movable) {
      it = streams_.erase(it);
      continue;
    }
    if (crowded && movable && !capturing) idle.emplace_back(ss.last_used, it->first);
    ++it;
  }
  if (streams_.size() <= 2 * kKeptStreamStates) return;
  std::sort(idle.begin(), idle.end());
  for (const auto& [used, key] : idle) {
    if (streams_.size() <= kKeptStreamStates) break;
    streams_.erase(key);
  }
}

}  // namespace expanse::core
