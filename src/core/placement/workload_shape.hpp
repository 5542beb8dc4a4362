// Whether the device's workload repeats its structure with other sizes: training steps whose
// batch and sequence length vary, inference batches of varying shapes (docs/design.md, "Settling
// on a varying workload"). One per device, fed the large arena's allocations and frees under the
// device lock.
//
// The echo (placement_echo.hpp) names an allocation's point by the sizes of what came just before.
// This names its shape the same way, by the sizes' ratios instead of the sizes: each operation by
// kind and by how many powers of two (rounded) its size is from the one before. Two names: the
// last kShortHistory operations with how many live large blocks the stream holds, and the last
// kHistory operations alone (state made once between two steps, an optimizer's, changes the
// count but not the operations of the step after). A step of another batch or length scales
// every activation alike, so it reaches the shapes of the steps before at points the echo has
// never seen, asking for other sizes than the shape had. A workload that repeats exactly reaches
// known points; the layers of one model, alike in shape, ask for the same sizes at them.
//
// The answer: varies() from the moment at least kMoved of the last kWindow allocations came at a
// known shape (either name), at another size than it had last, and at a point the echo did not
// know; and from then on, for good (a workload that has varied pays for fine handles once; going
// back to coarse ones would pay again when it varies next). Measured, the most such allocations
// in any kWindow of a workload that repeats: 23 (cs336a_medium_128_train's first pass), 7 or
// fewer in fixed-shape runs of the generator from GPT-2 to 48 layers of width 1,600; a varying run
// of the generator reaches kMoved in its second to fourth step, hf_gpt2_s1 after 2,400
// allocations.
#pragma once

#include "core/base/mix64.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

class WorkloadShape {
 public:
  static constexpr size_t kHistory = 32;
  static constexpr size_t kShortHistory = 8;
  static constexpr size_t kWindow = 256;  // recent allocations judged
  static constexpr size_t kMoved = 64;    // of them, at a known shape with another size
  static constexpr size_t kSlots = size_t{1} << 14;  // shapes remembered per name (overwritten at random)

  // An operation on the large arena: a block of sz bytes allocated or freed.
  void note(size_t sz, bool freed) noexcept {
    const size_t prev = last_size_ == 0 ? sz : last_size_;
    // Powers of two from the previous size, rounded to the nearest (signed): sizes rounded to
    // 512 B put the ratio of two tensors of one step a hair above or below a power of two.
    const int steps = static_cast<int>(
        std::lround(std::log2(static_cast<double>(sz)) - std::log2(static_cast<double>(prev))));
    last_size_ = sz;
    history_[at_] = static_cast<uint64_t>(steps + 64) * 2 + (freed ? 1 : 0);
    at_ = (at_ + 1) % kHistory;
  }
  // An allocation of sz bytes now, by a stream holding live_blocks large blocks; point_known: the
  // echo knew its point. Out of host memory for the table (512 KiB, at the first call) nothing
  // is counted.
  void allocation(size_t sz, uint64_t live_blocks, bool point_known) noexcept {
    if (varies_) return;
    if (seen_.empty()) {
      try {
        seen_.assign(2 * kSlots, Slot{});
      } catch (...) {
        return;
      }
    }
    // Two names for the shape: the last kShortHistory operations with the stream's live blocks,
    // and the last kHistory operations alone (state made once between two steps, an optimizer's,
    // changes the count, not the operations of the step after).
    uint64_t with_count = mix64(0x51ED27 ^ (live_blocks * 0x9E3779B97F4A7C15ull));
    for (size_t i = kHistory - kShortHistory; i < kHistory; ++i) {
      with_count = mix64(with_count ^ history_[(at_ + i) % kHistory]);
    }
    uint64_t alone = 0xA10E;
    for (size_t i = 0; i < kHistory; ++i) alone = mix64(alone ^ history_[(at_ + i) % kHistory]);
    bool moved = false;
    auto look = [&](uint64_t h, Slot* table) {
      h |= 1;  // 0 marks an empty slot
      Slot& slot = table[(h >> 1) & (kSlots - 1)];
      moved |= slot.shape == h && slot.size != sz;
      slot = Slot{h, sz};
    };
    look(with_count, seen_.data());
    look(alone, seen_.data() + kSlots);
    moved &= !point_known;
    // The window as a ring of bits: the oldest leaves as the newest comes.
    uint64_t& word = window_[next_ / 64];
    const uint64_t bit = uint64_t{1} << (next_ % 64);
    if ((word & bit) != 0) --moved_;
    word = moved ? word | bit : word & ~bit;
    moved_ += moved ? 1 : 0;
    next_ = (next_ + 1) % kWindow;
    if (moved_ >= kMoved) {
      varies_ = true;
      seen_ = std::vector<Slot>();  // no longer needed
    }
  }
  bool varies() const noexcept { return varies_; }

 private:
  struct Slot {
    uint64_t shape = 0;
    size_t size = 0;  // what the allocation at that shape asked for last
  };
  uint64_t history_[kHistory] = {};
  size_t at_ = 0;
  size_t last_size_ = 0;
  std::vector<Slot> seen_;
  std::array<uint64_t, kWindow / 64> window_{};  // per recent allocation: moved
  size_t next_ = 0;
  size_t moved_ = 0;
  bool varies_ = false;
};

}  // namespace expanse::core
