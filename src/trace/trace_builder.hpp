// Turns a trace file's alloc/free records, keyed by address, into Trace::ops keyed by block id:
// the part the snapshot reader and the RMM CSV reader share. Private to trace/.
#pragma once

#include "trace/trace.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace expanse::trace {

class TraceBuilder {
 public:
  // preexisting_on_unknown_free: a free of an address never seen is a block allocated before
  // recording began (snapshots); otherwise it is an error (RMM logs).
  // locate: turns a record name into a message prefix ("f.csv:17", "f.pickle: byte 9 (...)").
  TraceBuilder(Trace& t, bool preexisting_on_unknown_free,
               std::function<std::string(const std::string&)> locate)
      : t_(t), lenient_(preexisting_on_unknown_free), locate_(std::move(locate)) {}

  // `where` names the record for messages ("line 17", "byte 123 (device_traces[0][4])").
  void alloc(uint64_t addr, uint64_t size, uint64_t stream,
             const std::function<std::string()>& where) {
    ++t_.allocs;
    auto it = live_.find(addr);
    if (it != live_.end()) {
      fail(where, "allocation at " + hex(addr) + ", which is still live (allocated at " +
                      it->second.where + " and not freed since)");
    }
    uint32_t b = next_block(addr);
    live_.emplace(addr, Live{b, size, where()});
    freed_.erase(addr);
    ops_.push_back({TraceOp::Type::alloc, stream_index(stream), b, size});
  }

  void free(uint64_t addr, uint64_t size, uint64_t stream,
            const std::function<std::string()>& where) {
    ++t_.frees;
    auto it = live_.find(addr);
    if (it == live_.end()) {
      auto f = freed_.find(addr);
      if (f != freed_.end()) {
        fail(where, "free of " + hex(addr) + ", which was already freed at " + f->second +
                        " (double free)");
      }
      if (!lenient_) {
        fail(where, "free of " + hex(addr) + ", which was never allocated");
      }
      preexisting(size, addr);
      ops_.push_back({TraceOp::Type::free, stream_index(stream), pre_.back().block, 0});
      freed_.emplace(addr, where());
      return;
    }
    if (it->second.size != size) {
      fail(where, "free of " + hex(addr) + " with size " + std::to_string(size) +
                      ", but it was allocated with size " + std::to_string(it->second.size) +
                      " at " + it->second.where);
    }
    ops_.push_back({TraceOp::Type::free, stream_index(stream), it->second.block, 0});
    freed_.emplace(addr, where());
    live_.erase(it);
  }

  bool is_live(uint64_t addr) const { return live_.count(addr) != 0; }
  // Whether the latest record at addr freed a block (no allocation there since).
  bool freed_last(uint64_t addr) const { return freed_.count(addr) != 0; }

  // A block live at the end of recording without a recorded allocation (snapshots).
  void live_at_end_without_alloc(uint64_t addr, uint64_t size) { preexisting(size, addr, true); }

  // Trace operations recorded so far (preexisting allocations not counted).
  uint64_t recorded_ops() const { return ops_.size(); }
  // The blocks allocated before recording began, in Trace::ops order, with their addresses.
  const std::vector<TorchRecording::Preexisting>& preexisting_blocks() const { return pre_at_; }
  // Every block's address, by block id.
  const std::vector<uint64_t>& block_addresses() const { return addr_; }

  void finish() {
    t_.ops.clear();
    t_.ops.reserve(pre_.size() + ops_.size());
    t_.ops.insert(t_.ops.end(), pre_.begin(), pre_.end());
    t_.ops.insert(t_.ops.end(), ops_.begin(), ops_.end());
    std::vector<uint64_t> size(t_.blocks, 0);
    uint64_t live = 0, peak = 0;
    for (const TraceOp& op : t_.ops) {
      if (op.type == TraceOp::Type::alloc) {
        size[op.block] = op.size;
        if (op.size > UINT64_MAX - live) {
          throw input_error(t_.path + ": the blocks live at once add up to more than 2^64 bytes");
        }
        live += op.size;
        peak = std::max(peak, live);
      } else {
        live -= size[op.block];
      }
    }
    t_.peak_live_bytes = peak;
    t_.live_at_end_bytes = live;
    if (t_.streams.empty()) t_.streams.push_back(0);
  }

 private:
  static std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
    return buf;
  }

  struct Live {
    uint32_t block;
    uint64_t size;
    std::string where;
  };

  [[noreturn]] void fail(const std::function<std::string()>& where, const std::string& what) {
    throw input_error(locate_(where()) + ": " + what);
  }

  uint32_t next_block(uint64_t addr) {
    if (t_.blocks == UINT32_MAX) throw input_error(t_.path + ": too many allocations");
    addr_.push_back(addr);
    return t_.blocks++;
  }

  void preexisting(uint64_t size, uint64_t addr, bool live_at_end = false) {
    ++t_.preexisting;
    t_.preexisting_bytes += size;
    pre_.push_back({TraceOp::Type::alloc, stream_index(0), next_block(addr), size});
    pre_at_.push_back({pre_.back().block, addr, size, live_at_end});
  }

  uint32_t stream_index(uint64_t id) {
    auto it = stream_ids_.find(id);
    if (it != stream_ids_.end()) return it->second;
    auto i = static_cast<uint32_t>(t_.streams.size());
    t_.streams.push_back(id);
    stream_ids_.emplace(id, i);
    return i;
  }

  Trace& t_;
  bool lenient_;
  std::function<std::string(const std::string&)> locate_;
  std::unordered_map<uint64_t, Live> live_;
  std::unordered_map<uint64_t, std::string> freed_;
  std::unordered_map<uint64_t, uint32_t> stream_ids_;
  std::vector<TraceOp> pre_;
  std::vector<TorchRecording::Preexisting> pre_at_;
  std::vector<TraceOp> ops_;
  std::vector<uint64_t> addr_;
};

}  // namespace expanse::trace
