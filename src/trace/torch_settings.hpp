// PyTorch's caching-allocator settings, as the models of src/models/torch_caching_model use them:
// parsed from PYTORCH_CUDA_ALLOC_CONF text (`--torch-conf`) or taken from a snapshot's own
// `allocator_settings`. Written from PyTorch's documented semantics (c10/cuda/CUDAAllocatorConfig).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace expanse::trace {

// The caching allocator's fixed sizes (c10/cuda/CUDACachingAllocator.cpp).
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kMinBlockSize = 512;         // every size is rounded to 512 B
inline constexpr uint64_t kSmallSize = 1 * kMiB;       // largest "small" request
inline constexpr uint64_t kSmallBuffer = 2 * kMiB;     // small segments (and expandable pages)
inline constexpr uint64_t kLargeBuffer = 20 * kMiB;    // large segments for 1-10 MiB requests
inline constexpr uint64_t kMinLargeAlloc = 10 * kMiB;  // from here, segments fit the request
inline constexpr uint64_t kRoundLarge = 2 * kMiB;      // ... rounded up to 2 MiB
inline constexpr int kRoundupIntervals = 16;           // roundup_power2_divisions: 1 MiB..32 GiB+

struct TorchSettings {
  uint64_t max_split_size = std::numeric_limits<uint64_t>::max();  // max_split_size_mb
  uint64_t max_non_split_rounding = kLargeBuffer;                  // max_non_split_rounding_mb
  double garbage_collection_threshold = 0;  // only acts with a memory fraction set
  double memory_fraction = 0;               // per_process_memory_fraction; 0: not set
  // Divisions per power-of-two interval: [0] sizes < 2 MiB, [i] [2^(20+i), 2^(21+i)), [15] the
  // rest.
  std::array<uint64_t, kRoundupIntervals> roundup_power2_divisions{};
  bool expandable_segments = false;

  // The divisions that apply to a request of `size` bytes.
  uint64_t divisions_for(uint64_t size) const noexcept;
  // The PYTORCH_CUDA_ALLOC_CONF text that gives these settings (for reports).
  std::string to_conf() const;
};

// PYTORCH_CUDA_ALLOC_CONF syntax: "max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4],
// expandable_segments:True". Keys that only concern pinned host memory or locking are accepted
// and ignored; an unknown key, a bad value or `backend:cudaMallocAsync` (not modelled) throws
// std::invalid_argument naming it.
TorchSettings parse_torch_conf(std::string_view conf);

// The request size after PyTorch's rounding (round_size): 512 B multiples, or the next
// power-of-two division when roundup_power2_divisions applies.
uint64_t torch_round_size(const TorchSettings& s, uint64_t size) noexcept;
// The segment cudaMalloc'd for a rounded request that no cached block serves
// (get_allocation_size): 2 MiB up to 1 MiB, 20 MiB below 10 MiB, else rounded to 2 MiB.
uint64_t torch_allocation_size(uint64_t rounded) noexcept;

}  // namespace expanse::trace
