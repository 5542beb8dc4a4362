// Physical memory held unmapped: handles by size in pages. Pages reclaimed from under free memory
// and handles a failed request gathered wait here to be mapped again or released.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <vector>

namespace expanse::core {

class HandlePool {
 public:
  void put(size_t pages, CUmemGenericAllocationHandle h);
  // Takes the handle of `pages` pages put last (one must be pooled).
  CUmemGenericAllocationHandle take(size_t pages);
  // The handle take(pages) would return (one must be pooled).
  CUmemGenericAllocationHandle peek(size_t pages) const;
  bool has(size_t pages) const;
  bool empty() const noexcept { return by_size_.empty(); }
  // Pages held in all.
  size_t pages() const noexcept { return pages_; }
  // Page counts of the smallest and largest handles pooled (the pool must not be empty).
  size_t smallest() const { return by_size_.begin()->first; }
  size_t largest() const { return by_size_.rbegin()->first; }
  // Page count of the largest pooled handle smaller than `pages`; 0 when none is.
  size_t largest_below(size_t pages) const;
  // Page count of the smallest pooled handle larger than `pages`; 0 when none is.
  size_t smallest_above(size_t pages) const;
  // Sizes of pooled handles smaller than `pages` that together make `pages`: largest first, none
  // larger than what is still missing, then, if that falls short, the smallest one left (the
  // sizes then make more). Fewer pages when all of them make less.
  std::vector<size_t> make_up(size_t pages) const;
  // f(pages, handle) for every pooled handle.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [n, hs] : by_size_) {
      for (CUmemGenericAllocationHandle h : hs) f(n, h);
    }
  }

 private:
  std::map<size_t, std::vector<CUmemGenericAllocationHandle>> by_size_;  // no empty entries
  size_t pages_ = 0;
};

}  // namespace expanse::core
