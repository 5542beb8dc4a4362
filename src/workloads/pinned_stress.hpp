// `expanse stress --pinned`: fragment a host NUMA node's pinned pool (core/host/host_pool.hpp)
// with a mix of offload-sized blocks freed in random order, then ask for one contiguous pinned
// buffer while enough pages exist, and check every page of it; beside it, what a model of
// PyTorch's CachingHostAllocator (power-of-two blocks, cached by size) would have to pin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace expanse::replay {

struct PinnedStressOptions {
  // The host memory the pool may pin (sim: its host capacity too; 0: 2 GiB, which a CI machine
  // holds; on a GPU: host_limit, 0 none but 2/5 of it then sizes nothing: give --size).
  size_t capacity = 0;
  size_t size = 0;  // the contiguous buffer (0: 2/5 of the capacity)
  uint64_t seed = 1;
  std::string conf;  // EXPANSE_CONF
};

struct PinnedStressResult {
  std::string driver;
  bool sim = false;
  size_t capacity = 0;
  size_t page_size = 0;
  size_t size = 0;
  uint64_t seed = 0;
  size_t blocks_made = 0;
  size_t live_at_request = 0;    // bytes of live blocks when the buffer was asked for
  size_t pinned_at_request = 0;  // pages held then
  size_t free_holes = 0;         // runs of free pages between live ones then
  bool allocated = false;
  std::string error;             // why not, when not
  bool verified = false;
  size_t pages_verified = 0;
  uint64_t remapped_pages = 0;   // moved from under free memory to the buffer
  size_t peak_pinned = 0;        // the most pages held over the run
  // The PyTorch model on the same workload: what it holds (live and cached power-of-two blocks)
  // and whether the buffer's power of two fits beside it, before and after empty_cache.
  size_t torch_pinned_at_request = 0;
  size_t torch_live_pinned = 0;
  size_t torch_request_pinned = 0;
  bool torch_fits = false;
  bool torch_fits_after_empty_cache = false;
  double seconds = 0;
};

// Throws expanse::usage_error for a bad option, driver_failure when the driver has no host VMM.
PinnedStressResult run_pinned_stress(const PinnedStressOptions& o);

}  // namespace expanse::replay
