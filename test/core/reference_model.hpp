// The reference model the allocator is checked against: live blocks, the pages they touch, and
// what docs/design.md, invariant 1 promises — allocate(n) succeeds whenever
// ceil(n / page) <= min(capacity, limit) pages - pages touched by live blocks.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <unordered_map>

namespace expanse::test {

struct ModelBlock {
  size_t requested;
  size_t size;  // 512-byte rounded
  CUstream stream;
  uint64_t seed;
};

// A size in [2^b, 2^(b+1)) for b uniform in [0, max_bits): log-uniform over 1 B .. 2^max_bits.
inline size_t log_uniform_size(std::mt19937_64& rng, size_t max_bits) {
  const auto bits = static_cast<size_t>(rng() % max_bits);
  return (size_t{1} << bits) + (bits == 0 ? 0 : rng() % (size_t{1} << bits));
}

class ReferenceModel {
 public:
  ReferenceModel(size_t page, size_t capacity) : page_(page), cap_pages_(capacity / page) {}

  void set_limit(size_t bytes) { limit_pages_ = bytes == SIZE_MAX ? SIZE_MAX : bytes / page_; }
  size_t page() const { return page_; }
  size_t touched() const { return refs_.size(); }
  // Pages that may still become touched.
  size_t avail() const {
    size_t cap = std::min(cap_pages_, limit_pages_);
    return cap > touched() ? cap - touched() : 0;
  }
  size_t pages_for(size_t n) const { return (n + page_ - 1) / page_; }
  // Pages of [addr, addr+size) that no live block touches yet.
  size_t new_pages(uintptr_t addr, size_t size) const {
    size_t n = 0;
    for (uint64_t p = addr / page_; p <= (addr + size - 1) / page_; ++p) n += refs_.count(p) == 0;
    return n;
  }
  bool overlaps(uintptr_t addr, size_t size) const {
    auto next = live_.lower_bound(addr);
    if (next != live_.end() && next->first < addr + size) return true;
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > addr) return true;
    }
    return false;
  }
  // "" when a block of `size` bytes placed at addr keeps invariant 1 and overlaps no live block,
  // `avail` being avail() before the request; otherwise what it breaks.
  std::string placement_error(uintptr_t addr, size_t size, size_t avail) const {
    if (overlaps(addr, size)) return "overlaps a live block";
    const size_t fresh = new_pages(addr, size);
    if (fresh > avail) {
      return "touches " + std::to_string(fresh) + " new pages, " + std::to_string(avail) +
             " exist";
    }
    return "";
  }
  void add(uintptr_t addr, const ModelBlock& b) {
    live_.emplace(addr, b);
    for (uint64_t p = addr / page_; p <= (addr + b.size - 1) / page_; ++p) ++refs_[p];
    requested_ += b.requested;
    allocated_ += b.size;
    ++allocs_;
  }
  void remove(uintptr_t addr) {
    auto it = live_.find(addr);
    const ModelBlock& b = it->second;
    for (uint64_t p = addr / page_; p <= (addr + b.size - 1) / page_; ++p) {
      auto r = refs_.find(p);
      if (--r->second == 0) refs_.erase(r);
    }
    requested_ -= b.requested;
    allocated_ -= b.size;
    ++frees_;
    live_.erase(it);
  }
  void oom() { ++ooms_; }

  const std::map<uintptr_t, ModelBlock>& live() const { return live_; }
  uint64_t requested() const { return requested_; }
  uint64_t allocated() const { return allocated_; }
  uint64_t allocs() const { return allocs_; }
  uint64_t frees() const { return frees_; }
  uint64_t ooms() const { return ooms_; }

 private:
  size_t page_;
  size_t cap_pages_;
  size_t limit_pages_ = SIZE_MAX;
  std::map<uintptr_t, ModelBlock> live_;
  std::unordered_map<uint64_t, uint32_t> refs_;
  uint64_t requested_ = 0, allocated_ = 0, allocs_ = 0, frees_ = 0, ooms_ = 0;
};

}  // namespace expanse::test
