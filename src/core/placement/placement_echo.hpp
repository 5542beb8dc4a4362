// Where an allocation went the last times the device's workload was at the same point: the
// memory of a settled layout (docs/design.md, "Settling on a repeated workload"). One per device.
//
// A point is named by what happened on the device just before (its last kHistory allocations and
// frees, by size), the request's size and stream, and how many live blocks of how many bytes that
// stream holds. A repeated workload (training steps, inference batches of one shape) reaches the
// same points in every repetition, so each allocation finds the address its twin had in the
// previous repetition. Placing it there again (when that memory is free, usable by the stream,
// mapped and needs no driver call) repeats the previous repetition's layout: its pages are the
// ones that repetition mapped, so the repetition after a settled one makes no driver call,
// whatever history shaped the layout. (The history is the device's, not the stream's: a stream
// that allocates once a repetition would carry earlier repetitions in its own.)
//
// A repetition's first allocations follow the previous repetition's last operations, not what
// came before the first repetition: their points are new in the second repetition. Each
// allocation is therefore also remembered under its short point (the same with only the last
// kShortHistory operations), asked where its point was never met, and trusted only while one
// point has led to it (a short point the workload reaches from several histories, such as a
// temporary allocated and freed over and over, names no one place).
//
// Bounded: the table grows with the number of points the workload reaches, up to kMaxSlots; a
// workload that reaches more points than that (nothing repeats) forgets them all and starts
// over. A point forgotten, or whose addresses are taken, is placed the usual way.
#pragma once

#include "core/base/mix64.hpp"

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace expanse::core {

class PlacementEcho {
 public:
  static constexpr size_t kHistory = 8;
  static constexpr size_t kShortHistory = 2;  // operations a short point names
  // Addresses kept per point: a workload that alternates between buffers (double buffering,
  // outputs kept into the next step) reaches a point while last time's block still lives.
  static constexpr size_t kWays = 3;
  // The table grows with the points the workload reaches (two an allocation: its point and its
  // short point): 40 bytes a slot, at most half of them used, up to kMaxSlots (20 MiB).
  static constexpr size_t kMinSlots = 256;
  static constexpr size_t kMaxSlots = size_t{1} << 19;

  // The point of an allocation of sz bytes made now on `stream`, which holds `live` live blocks
  // of `live_bytes` bytes.
  uint64_t point(size_t sz, uint64_t stream, uint64_t live, uint64_t live_bytes) const noexcept {
    return name(kHistory, sz, stream, live, live_bytes);
  }
  // The same with the last kShortHistory operations only.
  uint64_t short_point(size_t sz, uint64_t stream, uint64_t live,
                       uint64_t live_bytes) const noexcept {
    return name(kShortHistory, sz, stream, live, live_bytes);
  }
  // Whether an allocation was ever made at `point` (since the table last started over).
  bool known(uint64_t point) const noexcept { return find(point) != nullptr; }
  // recall() for a short point: nothing where several points led to it.
  std::array<CUdeviceptr, kWays> recall_short(uint64_t short_point) const noexcept {
    const Slot* s = find(short_point);
    return s != nullptr && s->from != kMany ? s->addrs : std::array<CUdeviceptr, kWays>{};
  }
  // The addresses the allocation at `point` had lately, latest first; 0 where none is
  // remembered.
  std::array<CUdeviceptr, kWays> recall(uint64_t point) const noexcept {
    const Slot* s = find(point);
    return s != nullptr ? s->addrs : std::array<CUdeviceptr, kWays>{};
  }
  // Never throws: a point that finds no room (out of host memory) is not remembered.
  void remember(uint64_t point, CUdeviceptr addr) noexcept { remember(point, 0, addr); }
  // The allocation at `point`, whose short point is `short_point`, went to addr.
  void remember_short(uint64_t short_point, uint64_t point, CUdeviceptr addr) noexcept {
    remember(short_point, point, addr);
  }
  // A block of sz bytes was allocated (freed: false) on the device.
  void note(size_t sz, bool freed) noexcept {
    history_[at_] = sz * 2 + (freed ? 1 : 0);
    at_ = (at_ + 1) % kHistory;
  }

 private:
  static constexpr uint64_t kMany = ~uint64_t{0};  // Slot::from: several points led here
  struct Slot {
    uint64_t point = 0;
    std::array<CUdeviceptr, kWays> addrs{};
    uint64_t from = 0;  // a short point's: the point that led to it, kMany if several did
  };
  void remember(uint64_t point, uint64_t from, CUdeviceptr addr) noexcept {
    Slot* s = find(point);
    if (s == nullptr) {
      if ((used_ + 1) * 2 > slots_.size() && !grow()) return;
      s = &slots_[probe_end(point)];
      *s = Slot{point, {}, from};
      ++used_;
    } else if (s->from != from) {
      s->from = kMany;
    }
    size_t i = 0;  // addr moves to the front; the oldest goes when it is new
    while (i + 1 < kWays && s->addrs[i] != addr) ++i;
    for (; i > 0; --i) s->addrs[i] = s->addrs[i - 1];
    s->addrs[0] = addr;
  }
  // A point naming the last `history` operations (the latest last), sz, stream and live blocks.
  uint64_t name(size_t history, size_t sz, uint64_t stream, uint64_t live,
                uint64_t live_bytes) const noexcept {
    uint64_t h = mix64(sz * 0x9E3779B97F4A7C15ull ^ (live << 1) ^ history);
    h = mix64(h ^ live_bytes);
    h = mix64(h ^ stream);
    for (size_t i = kHistory - history; i < kHistory; ++i) {
      h = mix64(h ^ history_[(at_ + i) % kHistory]);
    }
    return h | 1;  // 0 marks an empty slot
  }
  // Open addressing, linear probing; the table stays at most half full.
  const Slot* find(uint64_t point) const noexcept {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = point & mask;; i = (i + 1) & mask) {
      if (slots_[i].point == point) return &slots_[i];
      if (slots_[i].point == 0) return nullptr;
    }
  }
  Slot* find(uint64_t point) noexcept {
    return const_cast<Slot*>(static_cast<const PlacementEcho*>(this)->find(point));
  }
  size_t probe_end(uint64_t point) const noexcept {
    const size_t mask = slots_.size() - 1;
    size_t i = point & mask;
    while (slots_[i].point != 0) i = (i + 1) & mask;
    return i;
  }
  // Doubles the table up to kMaxSlots; a full table at that size starts over empty (the next
  // repetition teaches it again).
  bool grow() noexcept {
    const size_t n = slots_.empty() ? kMinSlots : std::min(slots_.size() * 2, kMaxSlots);
    std::vector<Slot> old;
    try {
      old.reserve(n);
      old.assign(n, Slot{});
    } catch (...) {
      return false;
    }
    old.swap(slots_);  // old: the previous table
    used_ = 0;
    if (old.size() >= kMaxSlots) return true;  // full at the largest size: start over
    for (const Slot& o : old) {
      if (o.point == 0) continue;
      slots_[probe_end(o.point)] = o;
      ++used_;
    }
    return true;
  }

  std::array<uint64_t, kHistory> history_{};
  size_t at_ = 0;
  std::vector<Slot> slots_;  // empty until the stream's first allocation
  size_t used_ = 0;
};

}  // namespace expanse::core
