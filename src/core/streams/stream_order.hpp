// Stream-ordered reuse (docs/design.md, invariant 3): when freed memory is safe for whom. A block
// freed on a stream is owned by that stream (only it may reuse it at once) until a fence recorded
// on it after the free completes; a block other streams used (the allocation stream, streams
// named with record_stream) is pending until each has passed the free.
//
// A stream is what the driver says it is, never a handle value:
// - a stream the application created is keyed by its driver id (cuStreamGetId, unique for the
//   process's life). A handle value that comes back for a new stream after cuStreamDestroy gets a
//   new id, so it inherits nothing; before a fence is recorded on a handle, its id is checked
//   again, and a handle that names another stream now marks the old one `gone`: only a sync of its
//   context proves its work done.
// - CU_STREAM_PER_THREAD is the calling thread's stream of its current context (its own id);
//   only that thread can record on it, other threads wait for its context instead.
// - NULL / CU_STREAM_LEGACY: the legacy stream of the current context, one stream whichever
//   thread names it (its driver id), as CUDA, PyTorch and RMM mean NULL; any thread may record
//   on it. Code built with --default-stream per-thread means its own per-thread stream by NULL:
//   EXPANSE_CONF null_stream:per_thread makes NULL mean CU_STREAM_PER_THREAD.
// - a driver without stream ids (older than CUDA 12.0): every call gets a fresh key, so nothing
//   is reused before a fence, recorded at the free by the freeing thread, or a context sync.
// Events live in the stream's context and are recorded with that context current. Any failure to
// record, query or synchronize means "not proven done": the memory waits, it is never reused.
// During stream capture nothing is recorded on, queried on or synchronized with a capturing
// stream (cuStreamIsCapturing is legal and asked first); its frees wait for the capture to end.
#pragma once

#include "core/placement/block_index.hpp"
#include "core/device/device_driver.hpp"
#include "core/streams/event_pool.hpp"
#include "core/base/options.hpp"
#include "core/placement/placement.hpp"
#include "core/streams/wanted_ranges.hpp"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <ostream>
#include <unordered_map>
#include <utility>
#include <vector>

namespace expanse::core {

// A number per thread that is never reused (std::thread::id values are, after a thread exits).
uint64_t this_thread_serial();

class StreamOrder {
 public:
  struct Fence {
    CUevent event;
    CUcontext ctx;  // the event's context (events are pooled per context)
    uint64_t seq;
  };
  // One stream identity. Frees on it are numbered; a fence recorded on it after free number n
  // proves frees up to n complete once it completes.
  struct StreamState {
    StreamKey key = 0;
    StreamIdentity::Kind kind = StreamIdentity::unknown;
    CUstream handle = nullptr;  // what fences are recorded on (CU_STREAM_LEGACY for legacy keys)
    uint64_t id = 0;            // the driver's id: re-checked before recording on `handle`
    CUcontext ctx = nullptr;    // the stream's context: its events live there
    uint64_t owner_thread = 0;  // per-thread (and unknown) streams: only this thread may record
    bool gone = false;          // `handle` no longer names it: only a context sync covers it
    bool capture_over = false;  // capturing kind: a later call saw its handle not capturing
    uint32_t live_refs = 0;     // live blocks allocated on it or recorded with it
    uint64_t live_bytes = 0;    // bytes of the live blocks allocated on it
    // Of them, the large arena's (their count and bytes): what the echo names a point by when
    // thread caches are on (small-arena blocks then come and go through them unseen).
    uint32_t large_refs = 0;
    uint64_t large_bytes = 0;
    // Free numbers come from one clock for all streams (seq_clock_), so that a state forgotten
    // with everything proven and made again starts at "proven up to now": a pending block's
    // (key, seq) and an unsettled block's seq from before stay satisfied.
    uint64_t free_seq = 0;      // the clock at its latest free (and use ended by a free)
    uint64_t safe_seq = 0;      // frees with seq <= this are known complete
    uint64_t last_used = 0;     // use_clock_ when a call last named it (which to forget first)
    std::deque<Fence> fences;   // at most 2 from this stream's own calls (record_fence)
    // A block this stream used and another stream freed, or that it freed after other streams
    // used it, or memory it freed that another stream wants (wanted_): its next call records a
    // fence (the handle can be trusted only then), this very one if it is the call's stream.
    bool owes_fence = false;
    // Where this stream freed blocks lately (most recent last, at most lifo_depth): places to
    // put the next block of the same size. Only hints: the memory is in the free index at once,
    // so no size holds pages another size needs (measured on the shared traces: parking freed
    // blocks out of the index held up to 8 % of peak live above it).
    std::vector<ReusePlace> recent;
  };
  // Streams a freed block waits for: (stream, its free number at the free).
  using Deps = std::vector<std::pair<StreamKey, uint64_t>>;

  StreamOrder(DeviceDriver& drv, Placement& placement, const AllocatorOptions& opts)
      : drv_(drv), placement_(placement), opts_(opts), events_(drv) {}
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // The stream of the call under way (allocate, free, record_stream) from state() until this
  // scope ends. Its handle is the only one expanse may pass to the driver: the caller vouches
  // for it now; any other may name a destroyed stream (undefined: a 580 driver crashed in
  // cuStreamIsCapturing on one), so other streams are covered by their own calls' fences or a
  // context synchronize.
  class Call {
   public:
    explicit Call(StreamOrder& o) : o_(o) {}
    ~Call() { o_.current_ = 0; }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    StreamOrder& o_;
  };
  // The calling thread is exiting (its cache's blocks go back from a thread_local destructor):
  // while this scope lasts no fence is recorded on its per-thread stream. The driver may have
  // torn that stream down already and would make a fresh, empty one on use, whose fence
  // completes at once while the old stream's work still runs; the blocks stay unproven until a
  // context synchronize proves them instead.
  class ThreadExit {
   public:
    explicit ThreadExit(StreamOrder& o) : o_(o) { o_.thread_exiting_ = true; }
    ~ThreadExit() { o_.thread_exiting_ = false; }
    ThreadExit(const ThreadExit&) = delete;
    ThreadExit& operator=(const ThreadExit&) = delete;

   private:
    StreamOrder& o_;
  };
  // ss is not forgotten while this scope lasts (allocate() holds a reference to it).
  class Hold {
   public:
    Hold(StreamOrder& o, const StreamState& ss) : o_(o) { o_.in_use_ = ss.key; }
    ~Hold() { o_.in_use_ = 0; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    StreamOrder& o_;
  };

  // The driver's identity of s (before the allocator's lock); a failure to ask is the caller's
  // error: expanse::usage_error naming `what` and ptr.
  StreamIdentity identify(CUstream s, const char* what, const void* ptr);
  // The state for what the calling thread means by s (identity from identify()). May query the
  // stream's context on first sight. Makes it the call's stream (see Call).
  StreamState& state(CUstream s, const StreamIdentity& id);

  // The state of key, if it is still tracked (a live block's allocation stream always is).
  StreamState* find_state(StreamKey key) {
    auto it = streams_.find(key);
    return it == streams_.end() ? nullptr : &it->second;
  }
  // A block carved for ss becomes live.
  void on_alloc(Block& b, StreamState& ss);
  // record_stream: ss uses live block b too.
  void add_user(Block& b, StreamState& ss);
  // A free of live block b on ss starts here: the host memory end_uses and on_free need is
  // allocated now (deps: returned empty, with room for every stream b waits for), so that out
  // of host memory the free fails here, with std::bad_alloc and nothing changed, or completes.
  Deps make_room_for_free(const Block& b, StreamState& ss);
  // Freeing live block b on ss ends its uses: the other streams it must wait for, into deps
  // (from make_room_for_free).
  Deps end_uses(const Block& b, StreamState& ss, Deps deps);
  // Freeing live block `it` on ss (after end_uses): pending on deps, else back in the free index
  // owned by ss (safe at once if a fence proved ss's work done). Allocates nothing (the room was
  // made) but fences, which are best effort: one not recorded for want of memory proves nothing.
  void on_free(BlockIt it, StreamState& ss, Deps deps);

  // ss's own call (it is the call's stream): records the fence it owes, unless one covers its
  // latest free or ended use already (stream_watch.cpp).
  void fence_if_owed(StreamState& ss) {
    if (!ss.owes_fence) return;
    if (ss.safe_seq < ss.free_seq && (ss.fences.empty() || ss.fences.back().seq < ss.free_seq)) {
      record_owed(ss);
    } else {
      ss.owes_fence = false;
    }
  }
  // Stream `for_key` wants [at, at + size), free but not usable by it because streams' frees
  // there are unproven (other streams' free memory, memory pending on other streams, or its own
  // free memory that does not merge with other streams' beside it until proven): the range
  // becomes wanted (frees there record fences from now on), and the fences those streams
  // recorded are queried (no record, no wait; for_key's own may be recorded now). Returns
  // whether a fence passed (what it proved is safe now: the caller tries again). False at once
  // when a live block lies in the range or it spans reservations. *not_proven: streams whose
  // fences fell short during this allocation (not asked again in it: a fence not passed now
  // will not have passed a moment later); those of this call are added.
  bool prove_for(CUdeviceptr at, size_t size, StreamKey for_key,
                 std::vector<StreamKey>* not_proven);
  // Makes freed memory whose streams' work has completed safe for every stream. With wait,
  // blocks until that work is done wherever that can be proven (a capturing stream's frees stay
  // unsafe).
  void poll(bool wait);
  // Waits for the calling stream's own work up to its latest free (one fence recorded on it now
  // if it has none there, then cuEventSynchronize), and makes what that proves safe. Nothing
  // else is waited for and no context is synchronized (a context sync from this thread would
  // invalidate another thread's global capture). Returns whether its frees are proven now
  // (false: none to prove, or no fence can be recorded: a capture, another thread's stream).
  bool prove_own(StreamKey key);
  // The application says the capture on handle s has ended (it announced the capture: see
  // capture_announcements.hpp). Until a call names s again, nothing else could tell: a handle
  // that may name a destroyed stream is never passed to the driver, and a capture that may be
  // under way keeps its context from being synchronized (its frees would wait forever).
  // Returns the keys of the captures that ended (their frees' owners).
  std::vector<StreamKey> capture_ended(CUstream s) {
    std::vector<StreamKey> keys;
    for (auto& [k, st] : streams_) {
      if (st.kind == StreamIdentity::capturing && st.handle == s) {
        st.capture_over = true;
        keys.push_back(k);
      }
    }
    return keys;
  }
  // Synchronizes ctx (unless a known stream of it captures, or the application announced a
  // capture in it) and marks every stream of it done up to now. Returns whether it did; when the
  // synchronize itself failed, last_sync_failure() says with what (else CUDA_SUCCESS: a capture).
  bool sync_context(CUcontext ctx);
  CUresult last_sync_failure() const noexcept { return sync_failure_; }
  // The distinct contexts of the streams known here (a peer device's streams included).
  std::vector<CUcontext> contexts() const {
    std::vector<CUcontext> out;
    for (const auto& [k, st] : streams_) {
      if (st.ctx != nullptr && std::find(out.begin(), out.end(), st.ctx) == out.end())
        out.push_back(st.ctx);
    }
    return out;
  }
  // Freed memory that some stream's work may still use (pending or owned free blocks).
  bool has_unfinished_frees() const noexcept {
    return !pending_.empty() || placement_.index().any_unsafe();
  }
  // Freed memory that the work of a stream other than `stream` may still use: what proving
  // could make usable to `stream` (its own free memory already is).
  bool others_have_unfinished_frees(StreamKey stream) const noexcept {
    return !pending_.empty() || placement_.index().any_unsafe_but(stream);
  }
  size_t tracked_streams() const noexcept { return streams_.size(); }
  // Blocks released from the pending list into the free index so far, and whether any waits.
  uint64_t pending_released() const noexcept { return pending_released_; }
  bool has_pending() const noexcept { return !pending_.empty(); }
  // Every stream identity (kind, driver id, handle, context, free/safe numbers, fences) and
  // every pending block, one a line.
  void describe(std::ostream& out) const;
  // Destroys every event (shutdown, after poll(true)).
  void destroy_events() { events_.destroy_all(); }

 private:
  // A freed block that other streams used: free again once each (stream, seq) has passed.
  struct Pending {
    BlockIt it;
    Deps deps;
  };
  enum class Recorded { yes, not_now, gone };

  StreamKey key_for(const StreamIdentity& id);
  void free_to_index(StreamState& ss, BlockIt it);
  Recorded record_fence(StreamState& ss, bool at_free = false);
  Recorded record_fence_or_throw(StreamState& ss, bool at_free);
  void record_owed(StreamState& ss);
  // ss's oldest fence has passed: what it covers is proven, its event goes back to the pool.
  void retire_oldest_fence(StreamState& ss);
  // Queries ss's fences oldest first (no record, no wait); whether its proven point advanced.
  bool query_fences(StreamState& ss);
  bool context_quiet(CUcontext ctx);
  bool run_context_wide(CUcontext ctx, const std::function<bool()>& op);
  // Records and checks fences; with wait, contexts whose streams cannot be proven otherwise are
  // synchronized.
  void prove(bool wait);
  void settle(StreamState& ss);
  void release_pending();
  void drop_finished_states();

  DeviceDriver& drv_;
  Placement& placement_;
  const AllocatorOptions& opts_;
  EventPool events_;
  std::unordered_map<StreamKey, StreamState> streams_;
  StreamKey next_key_ = StreamKey{1} << 63;  // made-up keys; driver ids stay below
  StreamKey in_use_ = 0;  // see Hold
  StreamKey current_ = 0;  // see Call; 0 outside a call
  bool thread_exiting_ = false;  // see ThreadExit
  uint64_t seq_clock_ = 0;  // numbers every free on every stream (StreamState::free_seq)
  uint64_t use_clock_ = 0;  // counts state() calls (StreamState::last_used)
  std::vector<Pending> pending_;
  CUresult sync_failure_ = CUDA_SUCCESS;  // of the last sync_context
  uint64_t pending_released_ = 0;  // see pending_released()
  WantedRanges wanted_;
};

}  // namespace expanse::core
