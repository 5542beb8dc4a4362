// Reading a PyTorch memory snapshot pickle (torch.cuda.memory._snapshot() / _dump_snapshot()).
#include "trace/trace.hpp"

#include "trace/pickle_reader.hpp"
#include "trace/release_inference.hpp"
#include "trace/trace_builder.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

namespace expanse::trace {
namespace {

class SnapshotReader {
 public:
  SnapshotReader(const std::string& path, const pickle::Document& doc) : path_(path), doc_(doc) {}

  [[noreturn]] void fail(const pickle::Node& n, const std::string& where,
                         const std::string& what) const {
    throw input_error(path_ + ": byte " + std::to_string(n.offset) +
                      (where.empty() ? "" : " (" + where + ")") + ": " + what);
  }

  const pickle::Node& get(const pickle::Node& d, const char* key, const std::string& where) const {
    const pickle::Node* v = doc_.find(d, key);
    if (v == nullptr) fail(d, where, "missing key '" + std::string(key) + "'");
    return *v;
  }
  const pickle::Node* get_opt(const pickle::Node& d, const char* key) const {
    return doc_.find(d, key);
  }

  void expect(const pickle::Node& n, pickle::Kind k, const std::string& where) const {
    if (n.kind != k) {
      fail(n, where, "expected a " + std::string(pickle::kind_name(k)) + ", found " +
                         doc_.describe(n));
    }
  }

  uint64_t uint(const pickle::Node& d, const char* key, const std::string& where) const {
    const pickle::Node& v = get(d, key, where);
    if (v.kind != pickle::Kind::integer) {
      fail(v, where + "['" + key + "']", "expected an int, found " + doc_.describe(v));
    }
    uint64_t out = 0;
    if (v.as_uint64(&out)) return out;
    if (v.range == pickle::IntRange::wider) {
      fail(v, where + "['" + key + "']",
           "the value does not fit in 64 bits: " + doc_.describe(v));
    }
    fail(v, where + "['" + key + "']", "negative value " + doc_.describe(v));
  }

  // An int used only as a name (a stream handle): any 64-bit pattern, negative included.
  uint64_t id(const pickle::Node& d, const char* key, const std::string& where) const {
    const pickle::Node& v = get(d, key, where);
    int64_t out = 0;
    if (v.as_int64(&out)) return static_cast<uint64_t>(out);
    uint64_t u = 0;
    if (v.as_uint64(&u)) return u;
    return uint(d, key, where);  // the error: not an int, or wider than 64 bits
  }

  std::string str(const pickle::Node& d, const char* key, const std::string& where) const {
    const pickle::Node& v = get(d, key, where);
    if (v.kind != pickle::Kind::string) {
      fail(v, where + "['" + key + "']", "expected a str, found " + doc_.describe(v));
    }
    return v.text;
  }

  const pickle::Node& node(pickle::NodeId id) const { return doc_[id]; }
  const pickle::Document& doc() const { return doc_; }

 private:
  const std::string& path_;
  const pickle::Document& doc_;
};

bool is_replayed_alloc(const std::string& a) { return a == "alloc"; }
bool is_replayed_free(const std::string& a) { return a == "free_completed" || a == "free"; }

// Whether an event's recorded stack (a list of {'name', 'filename', 'line'} frames) passes
// through torch.cuda.empty_cache(): Python's empty_cache or the allocator's emptyCache. Frames
// that are not dicts with a str name are skipped: stacks are a hint, never an error.
bool stack_names_empty_cache(const pickle::Document& doc, const pickle::Node& e) {
  const pickle::Node* frames = doc.find(e, "frames");
  if (frames == nullptr || frames->kind != pickle::Kind::list) return false;
  for (pickle::NodeId id : frames->items) {
    const pickle::Node& f = doc[id];
    if (f.kind != pickle::Kind::dict) continue;
    const pickle::Node* name = doc.find(f, "name");
    if (name == nullptr || name->kind != pickle::Kind::string) continue;
    if (name->text == "empty_cache" || name->text.find("emptyCache") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// One of the snapshot's segments, for the PyTorch model's start state (blocks added by the caller).
TorchRecording::Segment torch_segment(const SnapshotReader& r, const pickle::Node& seg,
                                      const std::string& where) {
  TorchRecording::Segment out;
  // Snapshots older than PyTorch 2.1 give no address: such a segment cannot start a model.
  if (r.get_opt(seg, "address") != nullptr) out.addr = r.uint(seg, "address", where);
  out.size = r.uint(seg, "total_size", where);
  if (r.get_opt(seg, "stream") != nullptr) out.stream = r.id(seg, "stream", where);
  const pickle::Node* type = r.get_opt(seg, "segment_type");
  out.small = type != nullptr && type->kind == pickle::Kind::string
                  ? type->text == "small"
                  : out.size == kSmallBuffer;  // small-pool segments are always 2 MiB
  const pickle::Node* exp = r.get_opt(seg, "is_expandable");
  out.expandable = exp != nullptr && exp->kind == pickle::Kind::boolean && exp->integer != 0;
  const pickle::Node* pool = r.get_opt(seg, "segment_pool_id");
  if (pool != nullptr && (pool->kind == pickle::Kind::tuple || pool->kind == pickle::Kind::list)) {
    for (pickle::NodeId id : pool->items) {
      const pickle::Node& v = r.node(id);
      if (v.kind == pickle::Kind::integer && v.integer != 0) out.private_pool = true;
    }
  }
  return out;
}

// allocator_settings (PyTorch >= 2.1 snapshots), as the model's settings. A value the model
// cannot use is noted in rec.settings_error, never an error for the snapshot.
void read_torch_settings(const pickle::Document& doc, const pickle::Node& root,
                         TorchRecording& rec) {
  const pickle::Node* a = doc.find(root, "allocator_settings");
  if (a == nullptr || a->kind != pickle::Kind::dict) return;
  TorchSettings s;
  auto field = [&](const char* key) { return doc.find(*a, key); };
  if (const pickle::Node* v = field("max_split_size"); v && v->kind == pickle::Kind::integer) {
    if (v->integer > 0) s.max_split_size = static_cast<uint64_t>(v->integer);  // -1: unlimited
  }
  if (const pickle::Node* v = field("garbage_collection_threshold");
      v && v->kind == pickle::Kind::floating) {
    s.garbage_collection_threshold = v->floating;
  }
  if (const pickle::Node* v = field("expandable_segments"); v && v->kind == pickle::Kind::boolean) {
    s.expandable_segments = v->integer != 0;
  }
  if (const pickle::Node* v = field("roundup_power2_divisions"); v && v->kind == pickle::Kind::dict) {
    for (size_t i = 0; i + 1 < v->items.size(); i += 2) {
      const pickle::Node& k = doc[v->items[i]];
      const pickle::Node& d = doc[v->items[i + 1]];
      if (k.kind != pickle::Kind::string || d.kind != pickle::Kind::integer || d.integer < 0) {
        rec.settings_error = "allocator_settings['roundup_power2_divisions'] holds " +
                             doc.describe(k) + ": " + doc.describe(d);
        return;
      }
      // Keys are the interval starts in MiB: "1", "2", ..., "32768".
      uint64_t mb = std::strtoull(k.text.c_str(), nullptr, 10);
      size_t index = 0;
      while (mb > 1 && index + 1 < s.roundup_power2_divisions.size()) {
        mb >>= 1;
        ++index;
      }
      s.roundup_power2_divisions[index] = static_cast<uint64_t>(d.integer);
    }
  }
  rec.settings = s;
}

}  // namespace

Trace load_snapshot(const std::string& path, std::string_view data, int device) {
  pickle::Document doc;
  try {
    doc = pickle::parse(data);
  } catch (const pickle::parse_error& e) {
    throw input_error(path + ": " + e.what() + " (not a readable PyTorch memory snapshot pickle)");
  }
  SnapshotReader r(path, doc);
  const pickle::Node& root = doc[doc.root()];
  if (root.kind != pickle::Kind::dict) {
    r.fail(root, "", "not a PyTorch memory snapshot: the pickle holds a " + doc.describe(root) +
                         ", expected a dict with 'segments' and 'device_traces'");
  }
  const pickle::Node* traces_p = r.get_opt(root, "device_traces");
  const pickle::Node* segments_p = r.get_opt(root, "segments");
  if (traces_p == nullptr || segments_p == nullptr) {
    std::string keys;
    for (size_t i = 0; i + 1 < root.items.size() && i < 20; i += 2) {
      keys += (keys.empty() ? "" : ", ") + doc.describe(doc[root.items[i]]);
    }
    r.fail(root, "", std::string("not a PyTorch memory snapshot: the top-level dict has no '") +
                         (traces_p == nullptr ? "device_traces" : "segments") + "' key (keys: " +
                         (keys.empty() ? "none" : keys) + ")");
  }
  r.expect(*traces_p, pickle::Kind::list, "device_traces");
  r.expect(*segments_p, pickle::Kind::list, "segments");

  Trace t;
  t.path = path;
  t.format = "pytorch-snapshot";

  // Which device: the one asked for, else the one with the most allocations.
  const auto& per_device = traces_p->items;
  std::vector<uint64_t> allocs(per_device.size(), 0);
  for (size_t d = 0; d < per_device.size(); ++d) {
    const pickle::Node& events = doc[per_device[d]];
    r.expect(events, pickle::Kind::list, "device_traces[" + std::to_string(d) + "]");
    for (pickle::NodeId id : events.items) {
      const pickle::Node& e = doc[id];
      if (e.kind != pickle::Kind::dict) continue;  // reported below for the chosen device
      const pickle::Node* a = doc.find(e, "action");
      if (a != nullptr && a->kind == pickle::Kind::string && is_replayed_alloc(a->text)) {
        ++allocs[d];
      }
    }
    if (allocs[d] != 0) ++t.devices_with_events;
  }
  if (device >= 0) {
    if (static_cast<size_t>(device) >= per_device.size()) {
      r.fail(*traces_p, "device_traces",
             "device " + std::to_string(device) + " asked for, but the snapshot records " +
                 std::to_string(per_device.size()) + " device(s)");
    }
    t.device = device;
  } else {
    auto best = std::max_element(allocs.begin(), allocs.end());
    if (best == allocs.end() || *best == 0) {
      r.fail(*traces_p, "device_traces",
             "the snapshot records no allocations (was it taken with "
             "torch.cuda.memory._record_memory_history() enabled?)");
    }
    t.device = static_cast<int>(best - allocs.begin());
  }

  // The trace: alloc / free_completed replayed; segment events give PyTorch's reserved memory.
  const std::string prefix = "device_traces[" + std::to_string(t.device) + "]";
  const pickle::Node& events = doc[per_device[static_cast<size_t>(t.device)]];
  TraceBuilder b(t, true, [&path](const std::string& w) { return path + ": " + w; });
  TorchRecording rec;
  read_torch_settings(doc, root, rec);
  // PyTorch's reserved bytes, as sums of segment sizes; a sum past 2^63 is not a real GPU's.
  auto sum = [&r](int64_t a, uint64_t size, int sign, const pickle::Node& at,
                  const std::string& where) {
    int64_t out = 0;
    const bool overflow =
        size > static_cast<uint64_t>(INT64_MAX) ||
        (sign > 0 ? __builtin_add_overflow(a, static_cast<int64_t>(size), &out)
                  : __builtin_sub_overflow(a, static_cast<int64_t>(size), &out));
    if (overflow) r.fail(at, where, "segment sizes add up past 2^63 bytes");
    return out;
  };
  int64_t seg_delta = 0;
  std::vector<int64_t> reserved_steps;
  for (size_t i = 0; i < events.items.size(); ++i) {
    const pickle::Node& e = doc[events.items[i]];
    auto where_s = [&] { return prefix + "[" + std::to_string(i) + "]"; };
    auto where = [&]() -> std::string {
      return "byte " + std::to_string(e.offset) + " (" + where_s() + ")";
    };
    r.expect(e, pickle::Kind::dict, where_s());
    ++t.events;
    const std::string action = r.str(e, "action", where_s());
    if (is_replayed_alloc(action) || is_replayed_free(action)) {
      const uint64_t addr = r.uint(e, "addr", where_s());
      const uint64_t size = r.uint(e, "size", where_s());
      const pickle::Node* s = r.get_opt(e, "stream");
      uint64_t stream = 0;
      if (s != nullptr) stream = r.id(e, "stream", where_s());
      if (is_replayed_alloc(action)) {
        b.alloc(addr, size, stream, where);
      } else {
        b.free(addr, size, stream, where);
      }
    }
    if (action.rfind("segment_", 0) == 0) {
      const pickle::Node* s = r.get_opt(e, "stream");
      rec.events.push_back({action, b.recorded_ops(), r.uint(e, "addr", where_s()),
                            r.uint(e, "size", where_s()),
                            s != nullptr ? r.id(e, "stream", where_s()) : 0, i,
                            action == "segment_free" && stack_names_empty_cache(doc, e)});
    } else if (action == "oom") {
      const pickle::Node* f = r.get_opt(e, "device_free");
      const pickle::Node* sz = r.get_opt(e, "size");
      const pickle::Node* st = r.get_opt(e, "stream");
      rec.ooms.push_back({b.recorded_ops(), sz != nullptr ? r.uint(e, "size", where_s()) : 0,
                          f != nullptr ? r.uint(e, "device_free", where_s()) : 0, i,
                          st != nullptr ? r.id(e, "stream", where_s()) : 0});
    }
    if (action == "segment_alloc" || action == "segment_map") {
      seg_delta = sum(seg_delta, r.uint(e, "size", where_s()), +1, e, where_s());
      reserved_steps.push_back(seg_delta);
    } else if (action == "segment_free" || action == "segment_unmap") {
      seg_delta = sum(seg_delta, r.uint(e, "size", where_s()), -1, e, where_s());
      reserved_steps.push_back(seg_delta);
    }
    // free_requested, snapshot, oom, ...: not replayed.
  }

  // The end state: PyTorch's segments (reserved memory) and the blocks still allocated.
  int64_t reserved_at_end = 0;
  for (size_t i = 0; i < segments_p->items.size(); ++i) {
    const pickle::Node& seg = doc[segments_p->items[i]];
    const std::string where = "segments[" + std::to_string(i) + "]";
    r.expect(seg, pickle::Kind::dict, where);
    const pickle::Node* dev = r.get_opt(seg, "device");
    if (dev != nullptr && r.uint(seg, "device", where) != static_cast<uint64_t>(t.device)) {
      continue;
    }
    reserved_at_end = sum(reserved_at_end, r.uint(seg, "total_size", where), +1, seg, where);
    rec.end_segments.push_back(torch_segment(r, seg, where));
    const pickle::Node& blocks = r.get(seg, "blocks", where);
    r.expect(blocks, pickle::Kind::list, where + "['blocks']");
    // Blocks tile their segment in order; snapshots older than PyTorch 2.1 give no address.
    std::optional<uint64_t> next_addr;
    if (r.get_opt(seg, "address") != nullptr) next_addr = r.uint(seg, "address", where);
    for (size_t j = 0; j < blocks.items.size(); ++j) {
      const pickle::Node& blk = doc[blocks.items[j]];
      const std::string bw = where + "['blocks'][" + std::to_string(j) + "]";
      r.expect(blk, pickle::Kind::dict, bw);
      const uint64_t size = r.uint(blk, "size", bw);
      std::optional<uint64_t> addr = next_addr;
      if (r.get_opt(blk, "address") != nullptr) addr = r.uint(blk, "address", bw);
      next_addr.reset();
      if (addr && *addr <= UINT64_MAX - size) next_addr = *addr + size;
      // Allocated, or freed by its tensor and waiting for its streams (free_completed not yet
      // recorded): either way it holds memory at the end.
      const std::string state = r.str(blk, "state", bw);
      const bool pending = state == "active_pending_free";
      const bool holds = state == "active_allocated" || pending;
      rec.end_segments.back().blocks.push_back({addr.value_or(0), size, holds});
      if (!holds) continue;
      const uint64_t at = addr ? *addr : r.uint(blk, "address", bw);  // (throws: none at all)
      if (b.is_live(at)) continue;
      // A pending free whose free_completed the trace records already came back there: the
      // snapshot contradicts its trace (a writer that completes frees at once but shows blocks
      // still waiting for streams as pending). The trace is what happened to the block; taking
      // it for a block allocated before recording would hold its memory from the start.
      if (pending && b.freed_last(at)) continue;
      b.live_at_end_without_alloc(at, size);
    }
  }
  b.finish();
  // Trace::ops puts the preexisting allocations first: event positions shift past them.
  for (auto& e : rec.events) e.op += t.preexisting;
  for (auto& o : rec.ooms) o.op += t.preexisting;
  rec.preexisting = b.preexisting_blocks();
  rec.block_addr = b.block_addresses();  // by block id, for trace/release_inference
  t.torch = std::move(rec);

  // Reserved before recording = reserved at the end minus the net change the trace recorded.
  int64_t reserved = 0;
  if (__builtin_sub_overflow(reserved_at_end, seg_delta, &reserved)) {
    r.fail(root, "segments", "segment sizes add up past 2^63 bytes");
  }
  int64_t peak = reserved;
  for (int64_t step : reserved_steps) {
    int64_t v = 0;
    if (__builtin_add_overflow(reserved, step, &v)) {
      r.fail(root, "segments", "segment sizes add up past 2^63 bytes");
    }
    peak = std::max(peak, v);
  }
  t.torch_peak_reserved_bytes = static_cast<uint64_t>(std::max<int64_t>(peak, 0));
  infer_releases(t);
  return t;
}

}  // namespace expanse::trace
