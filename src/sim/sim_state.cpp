// The sim's global state and its control surface (sim.hpp).
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "conf/env_config.hpp"
#include "sim/sim_internal.hpp"

#include <sys/mman.h>

namespace expanse::sim {
namespace detail {
namespace {

std::mutex g_mutex;
State* g_state = nullptr;  // never destroyed: calls during static destruction still work
std::atomic<uint64_t> g_counts[kEntryCount];
// fast_calls(cuStreamGetId) at the last reset_counts / reset: the counts start from there.
std::atomic<uint64_t> g_fast_base{0};
std::atomic<uint64_t> g_fast_base_capturing{0};
std::atomic<uint64_t> g_next_generation{1};
SimConfig g_config;

struct ThreadContexts {
  uint64_t generation;
  ContextStack stack;
};
// Zero-initialized and never destroyed (see ContextStack).
thread_local ThreadContexts t_contexts;

bool is_power_of_two(size_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

void validate(const SimConfig& c) {
  if (c.devices < 0 || c.devices > kMaxDevices) {
    throw std::invalid_argument("sim: devices must be in [0, 64], not " +
                                std::to_string(c.devices));
  }
  if (!is_power_of_two(c.granularity) || c.granularity < host_page_size()) {
    throw std::invalid_argument("sim: granularity " + std::to_string(c.granularity) +
                                " is not a power of two >= the host page size");
  }
  if (c.capacity == 0 || c.capacity % c.granularity != 0) {
    throw std::invalid_argument("sim: capacity " + std::to_string(c.capacity) +
                                " is not a positive multiple of the granularity " +
                                std::to_string(c.granularity));
  }
}

}  // namespace

// Handle values of streams, events and graphs: pointer-like, distinct per kind, never
// dereferenced (the sim looks them up).
constexpr uintptr_t kStreamHandleBase = 0x00005e5700000000;
constexpr uintptr_t kEventHandleBase = 0x00005e5e00000000;
constexpr uintptr_t kGraphHandleBase = 0x00005e9700000000;

State::State(const SimConfig& c) : cfg(c), costs(CostTable::get_default()) {
  generation = g_next_generation.fetch_add(1);
  fast_priced = fast_calls(driver::EntryPoint::stream_get_id);
  fast_priced_capturing = fast_calls(driver::EntryPoint::stream_is_capturing);
  next_stream_handle = kStreamHandleBase;
  next_event_handle = kEventHandleBase;
  next_graph_handle = kGraphHandleBase;
  for (int d = 0; d < cfg.devices; ++d) {
    auto dev = std::make_unique<Device>();
    dev->ordinal = d;
    dev->ctx.device = d;
    dev->ctx.id = next_ctx_id++;
    dev->default_stream = std::make_shared<Stream>();
    dev->default_stream->handle = CU_STREAM_LEGACY;
    dev->default_stream->id = next_stream_id++;
    dev->default_stream->device = d;
    dev->default_stream->is_default = true;
    devices.push_back(std::move(dev));
  }
}

State::~State() {
  // Streams and captures point at each other while a capture is under way.
  for (auto& c : captures) {
    for (auto& m : c->members) m->capture.reset();
    c->members.clear();
  }
  // Newest (highest) first, so that the placement cursor comes all the way back.
  for (auto it = reservations.rbegin(); it != reservations.rend(); ++it)
    va_release(it->first, it->second.size);
  // Pending work that would touch pinned host memory is dropped with the streams (never run).
  for (auto& [base, h] : host_allocations) munmap(reinterpret_cast<void*>(base), h.mapped);
}

std::mutex& state_mutex() noexcept { return g_mutex; }

State& state_locked() {
  if (g_state == nullptr) {
    g_state = new State(SimConfig{});
    g_config = g_state->cfg;
  }
  return *g_state;
}

std::atomic<uint64_t>* call_counters() noexcept { return g_counts; }

ContextStack& context_stack(State& s) {
  if (t_contexts.generation != s.generation) {
    t_contexts.stack.clear();
    t_contexts.generation = s.generation;
  }
  return t_contexts.stack;
}

Context* find_context(State& s, CUcontext ctx) noexcept {
  if (ctx == nullptr) return nullptr;
  for (auto& d : s.devices) {
    if (reinterpret_cast<CUcontext>(&d->ctx) == ctx) return &d->ctx;
  }
  return nullptr;
}

const Context* current_context_unlocked() noexcept {
  return t_contexts.stack.empty() ? nullptr : t_contexts.stack.back();
}

int current_device(State& s) noexcept {
  auto& stack = context_stack(s);
  if (stack.empty()) return -1;
  const int d = stack.back()->device;
  return s.devices[static_cast<size_t>(d)]->primary_refs > 0 ? d : -1;
}

// ---- streams ----------------------------------------------------------------------------------

uint64_t thread_token() noexcept {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1);
  return token;
}

Stream* resolve_stream(State& s, CUstream h, int default_device) {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (raw == 0 || raw == 1 || raw == 2) {  // NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
    if (default_device < 0 || default_device >= static_cast<int>(s.devices.size())) return nullptr;
    if (raw != 2) return s.devices[static_cast<size_t>(default_device)]->default_stream.get();
    auto& slot = s.per_thread_streams[{thread_token(), default_device}];
    if (!slot) {
      slot = std::make_shared<Stream>();
      slot->handle = CU_STREAM_PER_THREAD;
      slot->id = s.next_stream_id++;
      slot->device = default_device;
      slot->per_thread = true;
    }
    return slot.get();
  }
  auto it = s.streams.find(raw);
  return it == s.streams.end() ? nullptr : it->second.get();
}

CUresult dead_stream_code(State& s, CUstream h) noexcept {
  auto it = s.dead_streams.find(reinterpret_cast<uintptr_t>(h));
  if (it == s.dead_streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  ++s.dead_handle_uses;
  return it->second;
}

void progress(State& s) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (auto it = s.busy.begin(); it != s.busy.end();) {
      Stream& st = *it->second;
      if (!st.held) {
        while (!st.pending.empty()) {
          const Stream::Item& item = st.pending.front();
          const bool ready =
              item.due <= s.host_clock &&
              std::all_of(item.deps.begin(), item.deps.end(),
                          [](const Stream::Dep& d) { return d.stream->done_seq >= d.seq; });
          if (!ready) break;
          Stream::Effect effect = std::move(st.pending.front().effect);
          st.done_seq = item.seq;
          st.pending.pop_front();
          if (effect) effect(s);
          changed = true;
        }
      }
      if (st.pending.empty()) {
        it = s.busy.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void force_complete(State& s, Stream& st, uint64_t upto) {
  // Dependencies always point at items recorded earlier, so this recursion terminates.
  while (!st.pending.empty() && st.pending.front().seq <= upto) {
    Stream::Item item = std::move(st.pending.front());
    st.pending.pop_front();
    for (auto& d : item.deps) force_complete(s, *d.stream, d.seq);
    st.done_seq = item.seq;
    if (item.effect) item.effect(s);
  }
}

void complete_host_range(State& s, uintptr_t lo, uintptr_t hi) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> todo;
  for (auto& [key, st] : s.busy) {
    uint64_t upto = 0;
    for (const Stream::Item& item : st->pending) {
      if (item.host_lo < hi && lo < item.host_hi) upto = item.seq;
    }
    if (upto != 0) todo.emplace_back(st, upto);
  }
  for (auto& [st, upto] : todo) force_complete(s, *st, upto);
  progress(s);
}

void complete_device(State& s, int device) {
  std::vector<std::shared_ptr<Stream>> todo;
  for (auto& [key, st] : s.busy) {
    if (st->device == device) todo.push_back(st);
  }
  for (auto& st : todo) force_complete(s, *st, st->last_seq());
  progress(s);
}

// ---- host protection ----------------------------------------------------------------------------

bool sync_host_protection(State& s, uintptr_t va, size_t len) {
  if (!s.cfg.backing || len == 0) return true;
  const uintptr_t end = va + len;
  auto it = s.mappings.upper_bound(va);
  if (it != s.mappings.begin()) --it;
  uintptr_t run_start = 0;
  uintptr_t run_end = 0;
  int run_flags = -1;
  bool ok = true;
  auto flush = [&] {
    if (run_flags >= 0 && run_end > run_start)
      ok = va_protect(run_start, run_end - run_start, run_flags) && ok;
    run_flags = -1;
  };
  for (; it != s.mappings.end() && it->first < end; ++it) {
    const uintptr_t mbase = it->first;
    const Mapping& m = it->second;
    if (mbase + m.size <= va) continue;
    for (auto a = m.access.begin(); a != m.access.end(); ++a) {
      auto next = std::next(a);
      uintptr_t lo = mbase + a->first;
      uintptr_t hi = mbase + (next == m.access.end() ? m.size : next->first);
      lo = std::max(lo, va);
      hi = std::min(hi, end);
      if (lo >= hi) continue;
      const int f = a->second.host_flags();
      if (f == run_flags && lo == run_end) {
        run_end = hi;
      } else {
        flush();
        run_start = lo;
        run_end = hi;
        run_flags = f;
      }
    }
  }
  flush();
  return ok;
}

}  // namespace detail

using detail::State;
using detail::state_locked;
using detail::state_mutex;

// ---- configuration ------------------------------------------------------------------------------

void reset(const SimConfig& cfg) {
  detail::validate(cfg);
  std::lock_guard<std::mutex> lock(state_mutex());
  // Build the new state first: if anything throws, the old one stays.
  auto fresh = std::make_unique<State>(cfg);
  delete detail::g_state;
  detail::g_state = fresh.release();
  detail::g_config = cfg;
  detail::forget_stream_ids();
  for (size_t i = 0; i < detail::kEntryCount; ++i) {
    detail::set_injection_armed(static_cast<driver::EntryPoint>(i), false);
  }
  for (auto& c : detail::g_counts) c.store(0);
  detail::g_fast_base.store(detail::fast_calls(driver::EntryPoint::stream_get_id));
  detail::g_fast_base_capturing.store(
      detail::fast_calls(driver::EntryPoint::stream_is_capturing));
}

const SimConfig& config() {
  std::lock_guard<std::mutex> lock(state_mutex());
  state_locked();
  return detail::g_config;
}

// ---- call accounting ----------------------------------------------------------------------------

namespace {
// Calls of e (cuStreamGetId, cuStreamIsCapturing) answered without the lock since the counts
// were last reset.
uint64_t fast_since_reset(driver::EntryPoint e) {
  if (e == driver::EntryPoint::stream_get_id) {
    return detail::fast_calls(e) - detail::g_fast_base.load();
  }
  if (e == driver::EntryPoint::stream_is_capturing) {
    return detail::fast_calls(e) - detail::g_fast_base_capturing.load();
  }
  return 0;
}
uint64_t fast_since_reset() {
  return fast_since_reset(driver::EntryPoint::stream_get_id) +
         fast_since_reset(driver::EntryPoint::stream_is_capturing);
}
}  // namespace

uint64_t call_count(driver::EntryPoint e) {
  const int i = static_cast<int>(e);
  if (i < 0 || i >= detail::kEntryCount) return 0;
  const uint64_t fast = fast_since_reset(e);
  return detail::g_counts[i].load() + fast;
}

uint64_t total_calls() {
  uint64_t n = fast_since_reset();
  for (const auto& c : detail::g_counts) n += c.load();
  return n;
}

void reset_counts() {
  std::lock_guard<std::mutex> lock(state_mutex());
  for (auto& c : detail::g_counts) c.store(0);
  const uint64_t fast = detail::fast_calls(driver::EntryPoint::stream_get_id);
  const uint64_t fast_capturing = detail::fast_calls(driver::EntryPoint::stream_is_capturing);
  detail::g_fast_base.store(fast);
  detail::g_fast_base_capturing.store(fast_capturing);
  state_locked().modeled_ns = 0;
  state_locked().fast_priced = fast;
  state_locked().fast_priced_capturing = fast_capturing;
}

// ---- failure injection --------------------------------------------------------------------------

void inject_failure(driver::EntryPoint e, uint64_t nth, CUresult code) {
  const int i = static_cast<int>(e);
  if (i < 0 || i >= detail::kEntryCount)
    throw std::invalid_argument("inject_failure: bad entry point");
  if (nth == 0) throw std::invalid_argument("inject_failure: nth counts from 1");
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  s.injections[static_cast<size_t>(i)][s.calls_seen[static_cast<size_t>(i)] + detail::fast_calls(e) +
                                        nth] = code;
  detail::set_injection_armed(e, true);
}

void clear_injections() {
  std::lock_guard<std::mutex> lock(state_mutex());
  for (auto& m : state_locked().injections) m.clear();
  for (size_t i = 0; i < detail::kEntryCount; ++i) {
    detail::set_injection_armed(static_cast<driver::EntryPoint>(i), false);
  }
}

// ---- cost model ---------------------------------------------------------------------------------

namespace {
// Prices the cuStreamGetId calls answered without the lock since the last time (lock held).
void price_fast_calls(State& s) {
  const uint64_t fast = detail::fast_calls(driver::EntryPoint::stream_get_id);
  s.modeled_ns += s.costs.cost_ns(driver::EntryPoint::stream_get_id, 0, 1) *
                  static_cast<double>(fast - s.fast_priced);
  s.fast_priced = fast;
  const uint64_t fast_capturing = detail::fast_calls(driver::EntryPoint::stream_is_capturing);
  s.modeled_ns += s.costs.cost_ns(driver::EntryPoint::stream_is_capturing, 0, 1) *
                  static_cast<double>(fast_capturing - s.fast_priced_capturing);
  s.fast_priced_capturing = fast_capturing;
}
}  // namespace

void set_cost_table(const CostTable& t) {
  std::lock_guard<std::mutex> lock(state_mutex());
  price_fast_calls(state_locked());  // at the old table's price
  state_locked().costs = t;
}

double modeled_seconds() {
  std::lock_guard<std::mutex> lock(state_mutex());
  price_fast_calls(state_locked());
  return state_locked().modeled_ns * 1e-9;
}

// ---- streams ------------------------------------------------------------------------------------

namespace {

detail::Stream* control_stream(State& s, CUstream stream, const char* what) {
  int dev = detail::current_device(s);
  if (dev < 0) dev = 0;
  detail::Stream* st = detail::resolve_stream(s, stream, dev);
  if (st == nullptr) {
    // A destroyed stream whose work is still pending can still be released (while its handle
    // value has not gone to a new stream).
    for (auto& [key, b] : s.busy) {
      if (b->handle == stream && b->destroyed) st = b.get();
    }
  }
  if (st == nullptr) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", static_cast<void*>(stream));
    throw std::invalid_argument(std::string(what) + ": " + buf + " is not a live sim stream");
  }
  return st;
}

}  // namespace

void hold_stream(CUstream stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  control_stream(s, stream, "hold_stream")->held = true;
}

void release_stream(CUstream stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  control_stream(s, stream, "release_stream")->held = false;
  detail::progress(s);
}

void release_all() {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  for (auto& [key, st] : s.busy) st->held = false;
  for (auto& [key, st] : s.streams) st->held = false;
  for (auto& [key, st] : s.per_thread_streams) st->held = false;
  for (auto& d : s.devices) d->default_stream->held = false;
  detail::progress(s);
}

void advance_host_clock(uint64_t ticks) {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  s.host_clock += ticks;
  detail::progress(s);
}

uint64_t host_clock() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return state_locked().host_clock;
}

uint64_t async_faults() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return state_locked().async_faults;
}

uint64_t dead_handle_uses() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return state_locked().dead_handle_uses;
}

size_t pending_events() {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  size_t n = 0;
  for (const auto& [key, e] : s.events) {
    if (!e->complete()) ++n;
  }
  return n;
}

// ---- outstanding --------------------------------------------------------------------------------

bool inside_call() noexcept { return detail::current_call() != nullptr; }

Outstanding outstanding(int device) {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  Outstanding o;
  o.reservations = s.reservations.size();  // VA belongs to no device: counted for every device
  for (const auto& [base, r] : s.reservations) o.reserved_bytes += r.size;
  for (const auto& [h, a] : s.allocations) {
    if (a->host) {  // a host NUMA node's, no device's: reported for each
      ++o.host_numa_allocations;
      o.host_numa_bytes += a->size;
      continue;
    }
    if (device >= 0 && a->device != device) continue;
    ++o.allocations;
    o.physical_bytes += a->size;
  }
  for (const auto& [va, m] : s.mappings) {
    if (device >= 0 && (m.alloc->host || m.alloc->device != device)) continue;
    ++o.mappings;
    o.mapped_bytes += m.size;
  }
  for (const auto& [key, st] : s.streams) {
    if (device < 0 || st->device == device) ++o.streams;
  }
  for (const auto& [key, e] : s.events) {
    if (device < 0 || e->device == device) ++o.events;
  }
  // Pinned host memory belongs to no device (CU_MEMHOSTALLOC_PORTABLE or not): reported for each.
  o.host_allocations = s.host_allocations.size();
  o.host_bytes = s.host_used;
  o.host_registrations = s.host_registered.size();
  o.host_registered_bytes = s.host_registered_used;
  return o;
}

std::string describe_outstanding() {
  const Outstanding o = outstanding(-1);
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  std::ostringstream out;
  out << o.reservations << " reservations (" << conf::format_size(o.reserved_bytes) << "), "
      << o.allocations << " allocations (" << conf::format_size(o.physical_bytes) << "), "
      << o.mappings << " mappings (" << conf::format_size(o.mapped_bytes) << "), " << o.streams
      << " streams, " << o.events << " events, " << o.host_allocations
      << " pinned host allocations (" << conf::format_size(o.host_bytes) << ")";
  constexpr size_t kShow = 16;
  char buf[160];
  size_t n = 0;
  for (const auto& [base, r] : s.reservations) {
    if (n++ == kShow) {
      out << "\n  ... " << (s.reservations.size() - kShow) << " more reservations";
      break;
    }
    std::snprintf(buf, sizeof buf, "\n  reservation 0x%llx + %s",
                  static_cast<unsigned long long>(base), conf::format_size(r.size).c_str());
    out << buf;
  }
  std::vector<const detail::Allocation*> allocs;
  for (const auto& [h, a] : s.allocations) allocs.push_back(a.get());
  std::sort(allocs.begin(), allocs.end(),
            [](const detail::Allocation* a, const detail::Allocation* b) {
              return a->handle < b->handle;
            });
  n = 0;
  for (const detail::Allocation* a : allocs) {
    if (n++ == kShow) {
      out << "\n  ... " << (allocs.size() - kShow) << " more allocations";
      break;
    }
    std::snprintf(buf, sizeof buf,
                  "\n  allocation handle 0x%llx: device %d, %s, %llu handle references, %llu "
                  "mappings",
                  static_cast<unsigned long long>(a->handle), a->device,
                  conf::format_size(a->size).c_str(), static_cast<unsigned long long>(a->user_refs),
                  static_cast<unsigned long long>(a->map_refs));
    out << buf;
  }
  n = 0;
  for (const auto& [base, h] : s.host_allocations) {
    if (n++ == kShow) {
      out << "\n  ... " << (s.host_allocations.size() - kShow) << " more pinned host allocations";
      break;
    }
    std::snprintf(buf, sizeof buf, "\n  pinned host allocation 0x%llx + %s, flags 0x%x",
                  static_cast<unsigned long long>(base), conf::format_size(h.size).c_str(), h.flags);
    out << buf;
  }
  n = 0;
  for (const auto& [va, m] : s.mappings) {
    if (n++ == kShow) {
      out << "\n  ... " << (s.mappings.size() - kShow) << " more mappings";
      break;
    }
    std::snprintf(buf, sizeof buf, "\n  mapping 0x%llx + %s -> handle 0x%llx",
                  static_cast<unsigned long long>(va), conf::format_size(m.size).c_str(),
                  static_cast<unsigned long long>(m.alloc->handle));
    out << buf;
  }
  return out.str();
}

void set_policy(const Policy& p) {
  std::lock_guard<std::mutex> lock(state_mutex());
  state_locked().policy = p;
}

size_t resident_bytes(int device) {
  std::lock_guard<std::mutex> lock(state_mutex());
  State& s = state_locked();
  size_t n = 0;
  for (auto& d : s.devices) {
    if (device < 0 || d->ordinal == device) n += d->store.resident_bytes();
  }
  return n;
}

}  // namespace expanse::sim
