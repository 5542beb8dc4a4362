// A set of disjoint half-open address ranges, adjacent ones merged: the memory a pool's blocks
// occupied, in the pool tests' models.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace expanse::test {

// A set of disjoint half-open address ranges, adjacent ones merged.
class RangeSet {
 public:
  void add(uintptr_t a, uintptr_t b) {
    auto it = m_.upper_bound(a);
    if (it != m_.begin()) {
      auto prev = std::prev(it);
      if (prev->second >= a) {
        a = prev->first;
        b = std::max(b, prev->second);
        it = m_.erase(prev);
      }
    }
    while (it != m_.end() && it->first <= b) {
      b = std::max(b, it->second);
      it = m_.erase(it);
    }
    m_.emplace(a, b);
  }
  bool overlaps(uintptr_t a, uintptr_t b) const {
    auto it = m_.upper_bound(a);
    if (it != m_.begin() && std::prev(it)->second > a) return true;
    return it != m_.end() && it->first < b;
  }
  size_t bytes() const {
    size_t n = 0;
    for (const auto& [a, b] : m_) n += b - a;
    return n;
  }
  void clear() { m_.clear(); }
  bool empty() const { return m_.empty(); }
  const std::map<uintptr_t, uintptr_t>& ranges() const { return m_; }

 private:
  std::map<uintptr_t, uintptr_t> m_;
};

}  // namespace expanse::test
