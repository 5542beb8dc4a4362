// What expanse_torch_free counts, for expanse_get_stats.
#pragma once

#include <cstdint>

namespace expanse::api {

struct TorchFreeCounts {
  uint64_t size_mismatches = 0;  // frees whose size disagreed with the block's (freed anyway)
  uint64_t unknown = 0;          // frees of pointers that were not live blocks (ignored)
};

// Counts for device since the process started.
TorchFreeCounts torch_free_counts(int device);

}  // namespace expanse::api
