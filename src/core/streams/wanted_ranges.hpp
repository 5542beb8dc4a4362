// Address ranges of free memory that a stream wanted while another stream's frees there were
// unproven (docs/design.md, "Settling on a repeated workload"). A stream that frees memory in a
// wanted range records a fence at that free (its own call: the one time its handle can be
// trusted), so that the next time the memory is wanted a query proves it. Ranges nobody wanted
// for kKeepCalls calls are forgotten when next looked at; past kMaxRanges all are forgotten (a
// workload that wants ever new places gains nothing from remembering them).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace expanse::core {

class WantedRanges {
 public:
  static constexpr uint64_t kKeepCalls = uint64_t{1} << 20;
  static constexpr size_t kMaxRanges = 4096;

  bool empty() const noexcept { return ranges_.empty(); }
  size_t size() const noexcept { return ranges_.size(); }

  // [lo, hi) is wanted at `now` (a call count). Overlapping and touching ranges merge. Never
  // throws: a range that finds no room (out of host memory) is not remembered.
  void want(CUdeviceptr lo, CUdeviceptr hi, uint64_t now) noexcept {
    if (lo >= hi) return;
    if (ranges_.size() >= kMaxRanges) ranges_.clear();
    auto it = ranges_.upper_bound(lo);
    if (it != ranges_.begin() && std::prev(it)->second.hi >= lo) --it;
    while (it != ranges_.end() && it->first <= hi) {
      lo = std::min(lo, it->first);
      hi = std::max(hi, it->second.hi);
      it = ranges_.erase(it);
    }
    try {
      ranges_.emplace(lo, Range{hi, now});
    } catch (...) {
    }
  }
  // Whether [lo, hi) meets or touches a range wanted within kKeepCalls of `now` (stale ones met
  // go). Touching counts: free neighbours merge, and the merge's proof is the later free's.
  bool meets(CUdeviceptr lo, CUdeviceptr hi, uint64_t now) noexcept {
    if (ranges_.empty()) return false;
    auto it = ranges_.upper_bound(lo);
    if (it != ranges_.begin() && std::prev(it)->second.hi >= lo) --it;
    bool met = false;
    while (it != ranges_.end() && it->first <= hi) {
      if (now - it->second.at > kKeepCalls) {
        it = ranges_.erase(it);
        continue;
      }
      met = true;
      break;
    }
    return met;
  }

 private:
  struct Range {
    CUdeviceptr hi;
    uint64_t at;  // when last wanted
  };
  std::map<CUdeviceptr, Range> ranges_;  // by start; disjoint
};

}  // namespace expanse::core
