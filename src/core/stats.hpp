// Per-device accounting. Every figure is exact (DESIGN.md invariant 5).
#pragma once

#include "driver_api/entry_points.hpp"

#include <array>
#include <cstdint>

namespace expanse::core {

struct DeviceStats {
  uint64_t requested_bytes = 0;   // sum of live requests, as asked
  uint64_t allocated_bytes = 0;   // sum of live blocks (512-byte rounded)
  uint64_t touched_bytes = 0;     // pages touched by live blocks x page size
  uint64_t mapped_bytes = 0;      // pages mapped into VA
  uint64_t cached_bytes = 0;      // mapped but touched by no live block
  uint64_t pooled_bytes = 0;      // physical pages held unmapped, ready to map
  uint64_t physical_bytes = 0;    // mapped + pooled: all physical memory held
  uint64_t va_reserved_bytes = 0;

  uint64_t peak_requested_bytes = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_mapped_bytes = 0;
  uint64_t peak_physical_bytes = 0;
  uint64_t peak_va_reserved_bytes = 0;

  uint64_t live_blocks = 0;
  uint64_t num_allocs = 0;
  uint64_t num_frees = 0;
  uint64_t num_ooms = 0;
  uint64_t num_reclaimed_pages = 0;  // pages unmapped under free blocks and mapped elsewhere
  uint64_t num_created_pages = 0;
  uint64_t num_released_pages = 0;

  std::array<uint64_t, driver::kEntryPointCount> driver_calls{};
  double modeled_driver_ns = 0;
  // Read-only stream lookups (cuStreamGetId, cuStreamGetCtx, cuStreamIsCapturing, capture-mode
  // switches): about one per allocate and free, cheap user-mode calls on a GPU. Counted apart so
  // that driver_calls measures work (zero in a steady state).
  uint64_t stream_queries = 0;
  // Stream identities expanse keeps state for (frees to prove done, live blocks). Bounded: a
  // stream whose state holds nothing is forgotten once there are more than a few dozen.
  uint64_t tracked_streams = 0;

  uint64_t total_driver_calls() const noexcept {
    uint64_t n = 0;
    for (auto c : driver_calls) n += c;
    return n;
  }
};

}  // namespace expanse::core
