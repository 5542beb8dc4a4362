#include "core/pages/handle_pool.hpp"

#include "core/base/check.hpp"

#include <iterator>

namespace expanse::core {

void HandlePool::put(size_t pages, CUmemGenericAllocationHandle h) {
  EXPANSE_ASSERT(pages > 0 && h != 0);
  // Out of host memory nothing changes (no empty entry is left behind).
  auto [it, added] = by_size_.try_emplace(pages);
  try {
    it->second.push_back(h);
  } catch (...) {
    if (added) by_size_.erase(it);
    throw;
  }
  pages_ += pages;
}

CUmemGenericAllocationHandle HandlePool::take(size_t pages) {
  auto it = by_size_.find(pages);
  EXPANSE_ASSERT(it != by_size_.end() && !it->second.empty() && pages_ >= pages);
  CUmemGenericAllocationHandle h = it->second.back();
  it->second.pop_back();
  if (it->second.empty()) by_size_.erase(it);
  pages_ -= pages;
  return h;
}

CUmemGenericAllocationHandle HandlePool::peek(size_t pages) const {
  return by_size_.at(pages).back();
}

bool HandlePool::has(size_t pages) const {
  auto it = by_size_.find(pages);
  return it != by_size_.end() && !it->second.empty();
}

size_t HandlePool::largest_below(size_t pages) const {
  auto it = by_size_.lower_bound(pages);
  return it == by_size_.begin() ? 0 : std::prev(it)->first;
}

size_t HandlePool::smallest_above(size_t pages) const {
  auto it = by_size_.upper_bound(pages);
  return it == by_size_.end() ? 0 : it->first;
}

std::vector<size_t> HandlePool::make_up(size_t pages) const {
  std::vector<size_t> out;
  size_t left = pages;
  size_t smallest_unused = 0;
  for (auto it = by_size_.lower_bound(pages); it != by_size_.begin() && left > 0;) {
    --it;
    size_t i = 0;
    for (; i < it->second.size() && it->first <= left; ++i) {
      out.push_back(it->first);
      left -= it->first;
    }
    if (i < it->second.size()) smallest_unused = it->first;
  }
  // What is missing is smaller than every size left unused: one of the smallest of them.
  if (left > 0 && smallest_unused != 0) out.push_back(smallest_unused);
  return out;
}

}  // namespace expanse::core
