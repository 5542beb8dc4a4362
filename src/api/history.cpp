#include "api/history.hpp"

#include "api/runtime.hpp"
#include "expanse/errors.hpp"
#include "trace/pickle_writer.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace expanse::api {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t stream_id(CUstream s) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s)); }

// Snapshot integers are Python ints; PyTorch writes them as int64.
int64_t i64(uint64_t v) { return static_cast<int64_t>(v); }

}  // namespace

const char* action_name(TraceEntry::Action a) noexcept {
  switch (a) {
    case TraceEntry::Action::alloc: return "alloc";
    case TraceEntry::Action::free_requested: return "free_requested";
    case TraceEntry::Action::free_completed: return "free_completed";
    case TraceEntry::Action::segment_map: return "segment_map";
    case TraceEntry::Action::segment_unmap: return "segment_unmap";
    case TraceEntry::Action::oom: return "oom";
  }
  return "unknown";
}

History& History::get() {
  static History* h = new History();  // never destroyed, see the header
  return *h;
}

void History::record(bool enabled, size_t max_entries) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (enabled) {
      for (auto& t : traces_) t.clear();
      max_entries_ = max_entries;
    }
    // Set before attaching below: an allocator created meanwhile sees the flag itself.
    recording_.store(enabled, std::memory_order_seq_cst);  // see Runtime::device
  }
  Runtime* rt = Runtime::current();
  if (rt == nullptr) return;
  for (int d = 0; d < rt->device_count(); ++d) {
    if (core::DeviceAllocator* a = rt->existing(d)) a->set_events(enabled ? this : nullptr);
  }
}

void History::attach_if_recording(core::DeviceAllocator& a) {
  if (recording_.load(std::memory_order_seq_cst)) a.set_events(this);  // see Runtime::device
}

void History::add(int device, TraceEntry e) noexcept {
  if (!recording() || device < 0) return;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (max_entries_ == 0) return;
    if (traces_.size() <= static_cast<size_t>(device)) traces_.resize(static_cast<size_t>(device) + 1);
    auto& t = traces_[static_cast<size_t>(device)];
    // Pages mapped (or unmapped) one after another at adjacent addresses are one range.
    if ((e.action == TraceEntry::Action::segment_map ||
         e.action == TraceEntry::Action::segment_unmap) &&
        !t.empty() && t.back().action == e.action && t.back().addr + t.back().size == e.addr) {
      t.back().size += e.size;
      return;
    }
    t.push_back(e);
    while (t.size() > max_entries_) t.pop_front();
  } catch (...) {
    // Out of host memory: the entry is lost, the allocator carries on.
  }
}

void History::on_alloc(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept {
  add(device, {TraceEntry::Action::alloc, addr, requested, stream_id(stream), now_us()});
}

// A free is complete for expanse when it is made: the block leaves the live books (stats, peaks)
// there, so the request and its completion are recorded together (write_segment says what that
// makes of a block still waiting for other streams).
void History::on_free(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept {
  const int64_t t = now_us();
  add(device, {TraceEntry::Action::free_requested, addr, requested, stream_id(stream), t});
  add(device, {TraceEntry::Action::free_completed, addr, requested, stream_id(stream), t});
}

void History::on_map(int device, CUdeviceptr addr, size_t bytes) noexcept {
  add(device, {TraceEntry::Action::segment_map, addr, bytes, 0, now_us()});
}

void History::on_unmap(int device, CUdeviceptr addr, size_t bytes) noexcept {
  add(device, {TraceEntry::Action::segment_unmap, addr, bytes, 0, now_us()});
}

void History::on_oom(int device, size_t requested, CUstream stream, size_t free_bytes) noexcept {
  add(device, {TraceEntry::Action::oom, free_bytes, requested, stream_id(stream), now_us()});
}

std::vector<TraceEntry> History::trace(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= traces_.size()) return {};
  const auto& t = traces_[static_cast<size_t>(device)];
  return std::vector<TraceEntry>(t.begin(), t.end());
}

int History::devices_traced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(traces_.size());
}

// ---- the snapshot ---------------------------------------------------------------------------

namespace {

// In PyTorch's format a block is active_pending_free from its free_requested until its
// free_completed, and a block's live span is alloc to free_completed. expanse records both at
// the free (History::on_free), so a block awaiting other streams (record_stream, or a free on
// another thread's legacy stream) is freed memory the allocator holds: inactive, as its other
// unproven free memory is. Shown pending, readers would take it for a block allocated before
// recording (its free is in the trace, yet the end state holds it).
void write_segment(trace::pickle::Writer& w, int device, const core::SegmentView& seg) {
  size_t allocated = 0, requested = 0;
  for (const auto& b : seg.blocks) {
    if (b.state == core::BlockView::State::live) {
      allocated += b.size;
      requested += b.requested;
    }
  }
  w.begin_dict();
  w.str("device");
  w.integer(device);
  w.str("address");
  w.integer(i64(seg.address));
  w.str("total_size");
  w.integer(i64(seg.size));
  w.str("allocated_size");
  w.integer(i64(allocated));
  w.str("active_size");
  w.integer(i64(allocated));
  w.str("requested_size");
  w.integer(i64(requested));
  // One VA space per device, shared by every stream: segments belong to no stream.
  w.str("stream");
  w.integer(0);
  w.str("segment_type");
  w.str(seg.small_arena ? "small" : "large");
  w.str("segment_pool_id");
  w.int_pair(0, 0);
  w.str("is_expandable");
  w.boolean(true);
  w.str("frames");
  w.begin_list();
  w.end_list();
  w.str("blocks");
  w.begin_list();
  for (const auto& b : seg.blocks) {
    const bool live = b.state == core::BlockView::State::live;
    w.begin_dict();
    w.str("address");
    w.integer(i64(b.address));
    w.str("size");
    w.integer(i64(b.size));
    w.str("requested_size");
    w.integer(i64(live ? b.requested : 0));
    w.str("state");
    w.str(live ? "active_allocated" : "inactive");
    w.str("frames");
    w.begin_list();
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_entry(trace::pickle::Writer& w, const TraceEntry& e) {
  w.begin_dict();
  w.str("action");
  w.str(action_name(e.action));
  w.str(e.action == TraceEntry::Action::oom ? "device_free" : "addr");
  w.integer(i64(e.addr));
  w.str("size");
  w.integer(i64(e.size));
  w.str("stream");
  w.integer(i64(e.stream));
  w.str("time_us");
  w.integer(e.time_us);
  w.str("frames");
  w.begin_list();
  w.end_list();
  w.end_dict();
}

}  // namespace

std::string snapshot_pickle() {
  Runtime& rt = Runtime::get();
  History& h = History::get();
  const int devices = std::max(rt.device_count(), h.devices_traced());
  trace::pickle::Writer w;
  w.begin_dict();
  w.str("segments");
  w.begin_list();
  for (int d = 0; d < rt.device_count(); ++d) {
    core::DeviceAllocator* a = rt.existing(d);
    if (a == nullptr) continue;
    for (const auto& seg : a->segments()) write_segment(w, d, seg);
  }
  w.end_list();
  w.str("device_traces");
  w.begin_list();
  for (int d = 0; d < devices; ++d) {
    w.begin_list();
    for (const TraceEntry& e : h.trace(d)) write_entry(w, e);
    w.end_list();
  }
  w.end_list();
  // What PyTorch's snapshot says about its allocator, as far as it applies (no split limit,
  // expandable segments), and which allocator this is.
  w.str("allocator_settings");
  w.begin_dict();
  w.str("PYTORCH_CUDA_ALLOC_CONF");
  w.str("");
  w.str("max_split_size");
  w.integer(-1);
  w.str("expandable_segments");
  w.boolean(true);
  w.str("roundup_power2_divisions");
  w.begin_dict();
  w.end_dict();
  w.str("allocator");
  w.str("expanse");
  w.str("driver");
  w.str(rt.driver().description());
  w.end_dict();
  w.end_dict();
  return w.finish();
}

void dump_snapshot(const std::string& path) {
  if (path.empty()) throw usage_error("expanse_dump_snapshot: the path is empty");
  const std::string data = snapshot_pickle();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw usage_error("expanse_dump_snapshot: cannot open '" + path + "' for writing: " +
                      std::strerror(errno));
  }
  const size_t n = std::fwrite(data.data(), 1, data.size(), f);
  const int werr = n == data.size() ? 0 : errno;
  if (std::fclose(f) != 0 || n != data.size()) {
    throw usage_error("expanse_dump_snapshot: writing '" + path + "' failed after " +
                      std::to_string(n) + " of " + std::to_string(data.size()) + " bytes: " +
                      std::strerror(werr != 0 ? werr : errno));
  }
}

}  // namespace expanse::api
