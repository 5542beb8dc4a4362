// Giving everything in a map of blocks back at shutdown, when nothing may wait and no error may
// escape: each entry is closed; one whose close failed (its unmap refused) is forgotten.
#pragma once

namespace expanse::core {

// close(key) gives the entry back (and erases it); it may throw. An entry still there after a
// throw is forgotten with forget(entry) (its accounting) and erased.
template <class Map, class Close, class Forget>
void close_all_quietly(Map& blocks, Close&& close, Forget&& forget) noexcept {
  while (!blocks.empty()) {
    const auto key = blocks.begin()->first;
    try {
      close(key);
    } catch (...) {
      auto it = blocks.find(key);
      if (it != blocks.end()) {  // the unmap failed: forget it (shutdown cannot wait)
        forget(it->second);
        blocks.erase(it);
      }
    }
  }
}

}  // namespace expanse::core
