// Whether the device's workload repeats its structure with other sizes: training steps whose
// batch and sequence length vary, inference batches of varying shapes (docs/design.md,
// "Settling on a varying workload"). One per device, fed the large arena's allocations and frees
// under the device lock.
//
// The echo (placement_echo.hpp) names an allocation's point by the sizes of what came just before.
// This names its shape the same way, by the sizes' ratios instead of the sizes: each of the last
// kHistory operations by kind and by how many powers of two its size is from the one before, and
// how many live blocks the stream holds. A step of another batch or length scales every
// activation alike, so it reaches the shapes of the step before at points the echo has never
// seen. A workload that repeats exactly reaches known points (the echo settles it); one that
// never repeats reaches neither.
//
// The answer is about a window of recent allocations: varies() once kWindow allocations have
// been seen and, of the most recent ones (halved every 2 x kWindow), at least 3 in 10 came at a
// known shape but an unknown point.
#pragma once

#include "core/mix64.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

class WorkloadShape {
 public:
  static constexpr size_t kHistory = 8;
  static constexpr uint64_t kWindow = 1024;
  static constexpr size_t kSlots = size_t{1} << 16;  // shapes remembered (overwritten at random)

  // An operation on the large arena: a block of sz bytes allocated or freed.
  void note(size_t sz, bool freed) noexcept {
    const size_t prev = last_size_ == 0 ? sz : last_size_;
    int steps = 0;  // powers of two from the previous size, signed
    for (size_t q = sz / prev; q > 1; q >>= 1) ++steps;
    for (size_t q = prev / sz; q > 1; q >>= 1) --steps;
    last_size_ = sz;
    history_[at_] = static_cast<uint64_t>(steps + 64) * 2 + (freed ? 1 : 0);
    at_ = (at_ + 1) % kHistory;
  }
  // An allocation now, by a stream holding live_blocks large blocks; point_known: the echo knew
  // its point. Out of host memory for the table (512 KiB, at the first call) nothing is counted.
  void allocation(uint64_t live_blocks, bool point_known) noexcept {
    uint64_t h = mix64(0x51ED27 ^ (live_blocks * 0x9E3779B97F4A7C15ull));
    for (size_t i = 0; i < kHistory; ++i) h = mix64(h ^ history_[(at_ + i) % kHistory]);
    h |= 1;  // 0 marks an empty slot
    if (seen_.empty()) {
      try {
        seen_.assign(kSlots, 0);
      } catch (...) {
        return;
      }
    }
    uint64_t& slot = seen_[h & (kSlots - 1)];
    const bool known = slot == h;
    slot = h;
    ++asked_;
    if (known && !point_known) ++moved_;
    if (asked_ >= 2 * kWindow) {
      asked_ /= 2;
      moved_ /= 2;
    }
  }
  bool varies() const noexcept { return asked_ >= kWindow && moved_ * 10 >= asked_ * 3; }

 private:
  uint64_t history_[kHistory] = {};
  size_t at_ = 0;
  size_t last_size_ = 0;
  std::vector<uint64_t> seen_;
  uint64_t asked_ = 0;
  uint64_t moved_ = 0;
};

}  // namespace expanse::core
