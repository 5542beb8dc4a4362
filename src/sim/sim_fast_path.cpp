// cuStreamGetId and cuStreamIsCapturing without the global lock. expanse asks both once per
// allocate and free; through the lock, 8 threads on one device spent most of a cached
// allocate+free pair waiting for each other.
//
// The answer is exactly the locked one: a thread caches (handle -> id) after a locked call that
// succeeded for a created stream, stamped with an epoch; everything that makes a handle stop
// naming its stream (cuStreamDestroy, a context reset, a sim reset) bumps the epoch under the
// lock first, so a destroyed or recycled handle never hits the cache and gets the locked answer
// (CUDA_ERROR_INVALID_HANDLE / CONTEXT_IS_DESTROYED, or the new stream's id). NULL,
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the calling thread's streams of its current
// context: their answer is cached with that context, used only while the thread's current
// context is still the same one, and a context's reset (its streams gone, or not current any
// more) bumps the epoch too. An injected failure for cuStreamGetId turns the cache off until it
// has fired. Calls answered here count and are priced like locked ones (call_count, total_calls,
// modeled_seconds).
//
// cuStreamIsCapturing: only a locked "not capturing" answer is cached, with both epochs. A stream
// starts capturing (or the legacy stream starts answering CAPTURE_IMPLICIT) only when a capture
// begins or a stream joins one, and both bump the capture epoch under the lock first.
#include "sim/sim_call.hpp"

#include <atomic>

namespace expanse::sim::detail {
namespace {

std::atomic<uint64_t> g_epoch{1};
std::atomic<uint64_t> g_capture_epoch{1};
std::atomic<bool> g_armed[kEntryCount];

// Calls answered without the lock, striped per thread so that threads do not share a counter.
constexpr size_t kStripes = 64;
struct alignas(64) Stripe {
  std::atomic<uint64_t> calls{0};            // cuStreamGetId
  std::atomic<uint64_t> capturing_calls{0};  // cuStreamIsCapturing
};
Stripe g_stripes[kStripes];

struct Entry {
  uint64_t epoch = 0;
  uintptr_t handle = 0;
  uint64_t id = 0;
  const Context* ctx = nullptr;  // NULL, LEGACY, PER_THREAD: the current context it holds for
};
// A "not capturing" answer: valid while both epochs (and, for special handles, ctx) hold.
struct Idle {
  uint64_t epoch = 0;
  uint64_t capture_epoch = 0;
  uintptr_t handle = 0;
  const Context* ctx = nullptr;
};
constexpr size_t kEntries = 8;
thread_local Entry t_cache[kEntries];
thread_local Entry t_special[3];  // NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
thread_local Idle t_idle[kEntries];
thread_local Idle t_idle_special[3];

Entry& slot_for(uintptr_t h) noexcept { return h <= 2 ? t_special[h] : t_cache[(h >> 9) % kEntries]; }
Idle& idle_for(uintptr_t h) noexcept {
  return h <= 2 ? t_idle_special[h] : t_idle[(h >> 9) % kEntries];
}

Stripe& my_stripe() noexcept {
  static std::atomic<size_t> next{0};
  thread_local const size_t i = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return g_stripes[i];
}

}  // namespace

bool fast_stream_id(CUstream h, unsigned long long* id) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (id == nullptr) return false;
  if (g_armed[static_cast<size_t>(EntryPoint::stream_get_id)].load(std::memory_order_acquire))
    return false;
  const Entry& e = slot_for(raw);
  if (e.epoch == 0 || e.handle != raw || e.epoch != g_epoch.load(std::memory_order_acquire))
    return false;
  if (raw <= 2 && (e.ctx == nullptr || e.ctx != current_context_unlocked())) return false;
  my_stripe().calls.fetch_add(1, std::memory_order_relaxed);
  *id = e.id;
  return true;
}

void remember_stream_id(CUstream h, uint64_t id) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  Entry& e = slot_for(raw);
  e.epoch = g_epoch.load(std::memory_order_relaxed);  // bumped only under the lock we hold
  e.handle = raw;
  e.id = id;
  e.ctx = raw <= 2 ? current_context_unlocked() : nullptr;
}

bool fast_not_capturing(CUstream h, CUstreamCaptureStatus* status) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (status == nullptr) return false;
  if (g_armed[static_cast<size_t>(EntryPoint::stream_is_capturing)].load(
          std::memory_order_acquire))
    return false;
  const Idle& e = idle_for(raw);
  if (e.epoch == 0 || e.handle != raw || e.epoch != g_epoch.load(std::memory_order_acquire) ||
      e.capture_epoch != g_capture_epoch.load(std::memory_order_acquire))
    return false;
  if (raw <= 2 && (e.ctx == nullptr || e.ctx != current_context_unlocked())) return false;
  my_stripe().capturing_calls.fetch_add(1, std::memory_order_relaxed);
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return true;
}

void remember_not_capturing(CUstream h) noexcept {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  Idle& e = idle_for(raw);
  e.epoch = g_epoch.load(std::memory_order_relaxed);  // both bumped only under the lock we hold
  e.capture_epoch = g_capture_epoch.load(std::memory_order_relaxed);
  e.handle = raw;
  e.ctx = raw <= 2 ? current_context_unlocked() : nullptr;
}

void forget_stream_ids() noexcept { g_epoch.fetch_add(1, std::memory_order_acq_rel); }

void capture_membership_changed() noexcept {
  g_capture_epoch.fetch_add(1, std::memory_order_acq_rel);
}

uint64_t fast_calls(EntryPoint e) noexcept {
  uint64_t n = 0;
  if (e == EntryPoint::stream_get_id) {
    for (const Stripe& s : g_stripes) n += s.calls.load(std::memory_order_relaxed);
  } else if (e == EntryPoint::stream_is_capturing) {
    for (const Stripe& s : g_stripes) n += s.capturing_calls.load(std::memory_order_relaxed);
  }
  return n;
}

void set_injection_armed(EntryPoint e, bool armed) noexcept {
  g_armed[static_cast<size_t>(e)].store(armed, std::memory_order_release);
}

}  // namespace expanse::sim::detail
