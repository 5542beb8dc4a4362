// PyTorch's CachingHostAllocator as far as pinned bytes go: a request becomes a block of the
// next power of two (c10's rounding), cached by that size when freed and reused only by a
// request of the same rounded size; with pinned_max_round_threshold_mb set, a request above the
// threshold is exact (to the host page) instead. The host pool bench and `expanse stress
// --pinned` put expanse beside it.
#pragma once

#include <cstddef>

namespace expanse::models {

inline size_t torch_host_pow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The bytes PyTorch pins for a request of `asked` bytes (round_threshold 0: always a power of two).
inline size_t torch_host_block_bytes(size_t asked, size_t round_threshold = 0) {
  if (round_threshold != 0 && asked > round_threshold) return (asked + 4095) / 4096 * 4096;
  return torch_host_pow2(asked);
}

}  // namespace expanse::models
