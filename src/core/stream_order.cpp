// Stream-ordered reuse (DESIGN.md invariant 3): freed blocks owned by their stream, record_stream,
// fences that make freed memory safe for every stream, and blocks pending on other streams.
//
// A stream is what the driver says it is, never a handle value (issue 8):
// - a stream the application created is keyed by its driver id (cuStreamGetId, unique for the
//   process's life). A handle value that comes back for a new stream after cuStreamDestroy gets a
//   new id, so it inherits nothing; before a fence is recorded on a handle, its id is checked
//   again, and a handle that names another stream now marks the old one `gone`: only a sync of its
//   context proves its work done.
// - CU_STREAM_PER_THREAD is the calling thread's stream of its current context (its own id);
//   only that thread can record on it, other threads wait for its context instead.
// - NULL / CU_STREAM_LEGACY: the legacy stream of the current context, keyed per calling thread
//   too (in code built with --default-stream per-thread, NULL is that thread's per-thread stream);
//   fences go on the legacy stream, which waits for every blocking stream of its context, the
//   per-thread ones included, so they cover both meanings.
// - a driver without stream ids (older than CUDA 12.0): every call gets a fresh key, so nothing
//   is reused before a fence, recorded at the free by the freeing thread, or a context sync.
// Events live in the stream's context and are recorded with that context current. Any failure to
// record, query or synchronize means "not proven done": the memory waits, it is never reused.
// During stream capture nothing is recorded on, queried on or synchronized with a capturing
// stream (cuStreamIsCapturing is legal and asked first); its frees wait for the capture to end.
#include "core/allocator_internal.hpp"
#include "core/capture_announcements.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>

namespace expanse::core {
namespace {

// A number per thread that is never reused (std::thread::id values are, after a thread exits).
uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

// What fences of a stream of this kind are recorded on: the legacy stream for legacy keys (which
// stand for NULL and CU_STREAM_LEGACY alike), the calling thread's per-thread stream, else s.
CUstream handle_for(StreamIdentity::Kind kind, CUstream s) {
  return kind == StreamIdentity::legacy       ? CU_STREAM_LEGACY
         : kind == StreamIdentity::per_thread ? CU_STREAM_PER_THREAD
                                              : s;
}

}  // namespace

StreamIdentity DeviceAllocator::identify(CUstream s, const char* what, const void* ptr) {
  try {
    return drv_.identify(s);
  } catch (const driver::driver_error& e) {
    throw usage_error("expanse: " + std::string(what) +
                      (ptr != nullptr ? " of " + hex(reinterpret_cast<CUdeviceptr>(ptr)) : "") +
                      " on device " + std::to_string(device()) + ": " + e.what() +
                      "; nothing was changed");
  }
}

DeviceAllocator::StreamState& DeviceAllocator::stream_state(CUstream s, const StreamIdentity& id) {
  drv_.add_stream_queries(id.queries);
  StreamKey key = 0;
  switch (id.kind) {
    case StreamIdentity::created:
    case StreamIdentity::per_thread:
      key = id.id;
      break;
    case StreamIdentity::legacy: {
      auto [it, added] = legacy_keys_.try_emplace({id.id, this_thread_serial()}, 0);
      if (added) it->second = next_key_++;
      key = it->second;
      break;
    }
    case StreamIdentity::unknown:
      key = next_key_++;
      break;
    case StreamIdentity::capturing:
      // One state per capture sequence (its id; stream ids and made-up keys stay below 2^62).
      key = id.id != 0 ? (StreamKey{1} << 62) | id.id : next_key_++;
      break;
  }
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
  if (ctx == nullptr) {
    ctx = drv_.primary();
  }
  ss.ctx = ctx;
  return ss;
}

void DeviceAllocator::free_to_index(StreamState& ss, BlockIt it) {
  const Arena a = res(it->second.res).arena;
  it = index_.insert_free(it, a);  // may merge with ss's other free blocks (seq: the largest)
  if (!it->second.safe && it->second.stream == ss.key && it->second.seq <= ss.safe_seq) {
    index_.make_safe(it, a);  // a fence passed it already
  }
}

void DeviceAllocator::record_stream(void* ptr, CUstream stream) {
  const StreamIdentity id = identify(stream, "record_stream", ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  auto it = index_.blocks().find(addr);
  if (it == index_.blocks().end() || it->second.state != BlockState::live) {
    throw usage_error("expanse: record_stream of " + hex(addr) + " on device " +
                      std::to_string(device()) + ": " + describe_pointer_locked(ptr) +
                      "; nothing was changed");
  }
  Block& b = it->second;
  CallStream call{current_};
  StreamState& ss = stream_state(stream, id);
  if (ss.key == b.stream) return;
  if (std::find(b.users.begin(), b.users.end(), ss.key) == b.users.end()) {
    b.users.push_back(ss.key);
    ++ss.live_refs;
  }
}

// ---- events --------------------------------------------------------------------------------

CUevent DeviceAllocator::get_event(CUcontext ctx) {
  auto& pool = event_pool_[ctx];
  if (!pool.empty()) {
    CUevent e = pool.back();
    pool.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (drv_.event_create(ctx, &e) != CUDA_SUCCESS) return nullptr;
  all_events_.emplace_back(ctx, e);
  return e;
}

void DeviceAllocator::put_event(CUcontext ctx, CUevent e) { event_pool_[ctx].push_back(e); }

// ---- fences ----------------------------------------------------------------------------------

// Whether no capture is known to be under way in ctx (a legacy-stream record or a context sync
// would implicitly synchronize with it, which invalidates the capture). Asks only what is safe to
// ask: the current call's stream and ctx's legacy stream (which
// answers IMPLICIT while a blocking stream of ctx captures); a capture seen by an earlier call
// counts as under way until a later call finds its stream not capturing. A capture on a
// non-blocking stream expanse never saw cannot be detected (no legal question finds it).
bool DeviceAllocator::context_quiet(CUcontext ctx) {
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
bool DeviceAllocator::run_context_wide(CUcontext ctx, const std::function<bool()>& op) {
  return context_quiet(ctx) && CaptureAnnouncements::run_unless_capturing(ctx, op);
}

// Records a fence after ss's latest free. not_now: it cannot be recorded from here or now
// (another thread's per-thread stream, a capture, a driver failure); gone: the handle no longer
// names ss (destroyed, perhaps recycled), so only a sync of ss.ctx covers its work.
// at_free: called by the thread freeing on ss's handle right now, which the caller promises is a
// valid stream (the only time an unknown stream's handle can be trusted).
DeviceAllocator::Recorded DeviceAllocator::record_fence(StreamState& ss, bool at_free) {
  if (ss.gone) return Recorded::gone;
  if (ss.kind == StreamIdentity::unknown && !at_free) return Recorded::gone;  // cannot be checked
  // Only handles that cannot name a destroyed stream: the current call's (the caller vouches
  // for it, see current_), the legacy stream, and the calling thread's per-thread stream.
  if (ss.key != current_ && ss.kind != StreamIdentity::legacy &&
      ss.kind != StreamIdentity::per_thread) {
    return Recorded::not_now;
  }
  if (ss.kind == StreamIdentity::capturing) return Recorded::not_now;  // would be captured
  if (ss.owner_thread != 0 && ss.owner_thread != this_thread_serial()) return Recorded::not_now;
  DeviceDriver::ScopedContext scope(drv_, ss.ctx);
  if (!scope.ok()) return Recorded::not_now;
  if (!drv_.surely_not_capturing(ss.handle)) return Recorded::not_now;
  CUevent e = nullptr;
  auto record = [&] {
    e = get_event(ss.ctx);
    if (e == nullptr) return false;
    if (drv_.event_record(ss.ctx, e, ss.handle) == CUDA_SUCCESS) return true;
    put_event(ss.ctx, e);
    return false;
  };
  // A record on the legacy stream waits for every blocking stream of the context: it is a
  // context-wide operation, like a context sync.
  if (!(ss.kind == StreamIdentity::legacy ? run_context_wide(ss.ctx, record) : record())) {
    return Recorded::not_now;
  }
  // A capture begun by another thread between the check and the record may have taken the
  // record into its graph; such an event must never be queried. It stays out of the pool.
  if (!drv_.surely_not_capturing(ss.handle)) return Recorded::not_now;
  ss.fences.push_back({e, ss.ctx, ss.free_seq});
  return Recorded::yes;
}

// Synchronizes ctx (unless a known stream of it captures, or the application announced a
// capture in it) and marks every stream of it done up to now. Returns whether it did.
// A capture that another thread begins, unannounced, on a stream of ctx between these checks and
// the sync is invalidated by it: the driver gives no way to see it coming
// (capture_announcements.hpp).
bool DeviceAllocator::sync_context(CUcontext ctx) {
  if (!run_context_wide(ctx, [&] { return drv_.ctx_synchronize(ctx) == CUDA_SUCCESS; })) {
    return false;
  }
  for (auto& [k, st] : streams_) {
    if (st.ctx != ctx) continue;
    st.safe_seq = st.free_seq;
    for (const Fence& f : st.fences) put_event(f.ctx, f.event);
    st.fences.clear();
  }
  return true;
}

// Makes ss's frees up to safe_seq safe for every stream.
void DeviceAllocator::settle(StreamState& ss) {
  for (Arena a : {Arena::small, Arena::large}) {
    for (BlockIt it : index_.owned_up_to(a, ss.key, ss.safe_seq)) index_.make_safe(it, a);
  }
}

// Makes freed memory whose streams' work has completed safe for every stream. With wait, blocks
// until that work is done wherever that can be proven (a capturing stream's frees stay unsafe).
void DeviceAllocator::poll(bool wait) {
  bool work = !pending_.empty();
  for (auto& [key, ss] : streams_) work = work || ss.safe_seq < ss.free_seq;
  if (!work) {  // nothing to record or query; blocks freed since may still be settled
    for (auto& [key, ss] : streams_) {
      if (ss.safe_seq > 0) settle(ss);
    }
    return;
  }
  DeviceDriver::RelaxedCapture relaxed(drv_);
  std::vector<CUcontext> to_sync;
  for (auto& [key, ss] : streams_) {
    if (ss.safe_seq >= ss.free_seq) continue;
    if (ss.fences.empty() || ss.fences.back().seq < ss.free_seq) {
      if (record_fence(ss) != Recorded::yes && wait) to_sync.push_back(ss.ctx);
    }
    while (!ss.fences.empty()) {
      Fence f = ss.fences.front();
      CUresult r = CUDA_SUCCESS;
      if (wait) {
        r = drv_.event_synchronize(f.event);
      } else {
        r = drv_.event_query(f.event);
      }
      if (r != CUDA_SUCCESS) {  // not ready, or an error: not proven done
        if (wait) to_sync.push_back(ss.ctx);
        break;
      }
      ss.safe_seq = std::max(ss.safe_seq, f.seq);
      put_event(f.ctx, f.event);
      ss.fences.pop_front();
    }
  }
  std::sort(to_sync.begin(), to_sync.end());
  to_sync.erase(std::unique(to_sync.begin(), to_sync.end()), to_sync.end());
  for (CUcontext ctx : to_sync) sync_context(ctx);
  for (auto& [key, ss] : streams_) {
    if (ss.safe_seq > 0) settle(ss);
  }

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
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    const Arena a = res(it->second.res).arena;
    it = index_.insert_free(it, a);  // may merge with its owner's other free blocks
    auto owner = streams_.find(it->second.stream);
    if (!it->second.safe &&
        (owner == streams_.end() || owner->second.safe_seq >= it->second.seq)) {
      index_.make_safe(it, a);
    }
  }
  drop_finished_states();
}

// States nobody can name again (gone streams, one-call keys of a driver without ids, captures
// that are over) go once everything freed on them is proven and no live block refers to them.
// Streams that may be named again go too, least recently used first, once more than
// 2 x kKeptStreamStates are tracked, down to kKeptStreamStates: an application that creates and
// destroys streams (the driver not recycling the handle values) would otherwise grow the table
// forever. One named again after being forgotten costs one cuStreamGetCtx, and starts at "proven
// up to now" (seq_clock_), so what still refers to its key stays satisfied. A capture under way
// is never forgotten (context_quiet needs it), nor the state of the current call.
void DeviceAllocator::drop_finished_states() {
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
