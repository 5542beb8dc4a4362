// A few extracted node handles of a standard container, kept for reuse.
//
// A free splits nothing but may merge with its neighbours, and the next allocate carves a block
// out again: without spares every allocate+free pair of a warm block would give the heap one
// node and take a new one for each index it touches. Two spares per kind cover a carve (its
// rest) and a free (its merge) in flight at once; more would only hold memory.
#pragma once

#include "core/base/check.hpp"

#include <array>
#include <cstddef>
#include <utility>

namespace expanse::core {

template <class Node, size_t N = 2>
class SpareNodes {
 public:
  bool empty() const noexcept { return count_ == 0; }

  // Keeps n if there is room (an empty handle is dropped); otherwise n's node is freed here.
  void keep(Node&& n) noexcept {
    if (n.empty() || count_ == N) return;
    nodes_[count_++] = std::move(n);
  }

  // One kept node (not empty). Requires !empty().
  Node take() noexcept {
    EXPANSE_ASSERT(count_ > 0);
    return std::move(nodes_[--count_]);
  }

 private:
  std::array<Node, N> nodes_;
  size_t count_ = 0;
};

}  // namespace expanse::core
