// Memory history in PyTorch's format: a trace per device of what the allocators did (alloc,
// free_requested / free_completed, segment_map / segment_unmap, oom), kept in a ring of
// max_entries per device while recording is on, and snapshots that add the current segments and
// blocks: the pickle torch.cuda.memory._snapshot() / _dump_snapshot() produce, so that
// pytorch.org/memory_viz draws it and `expanse replay` replays it.
#pragma once

#include "core/base/allocator_events.hpp"
#include "core/device_allocator.hpp"

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace expanse::api {

struct TraceEntry {
  enum class Action : uint8_t { alloc, free_requested, free_completed, segment_map, segment_unmap, oom };
  Action action = Action::alloc;
  uint64_t addr = 0;  // oom: bytes the device could still give (PyTorch's device_free)
  uint64_t size = 0;
  uint64_t stream = 0;
  int64_t time_us = 0;  // microseconds since the Unix epoch
};

const char* action_name(TraceEntry::Action a) noexcept;

class History final : public core::AllocatorEvents {
 public:
  // The process-wide history (never destroyed: allocators may report to it until exit).
  static History& get();

  // Starts recording (an empty trace, at most max_entries per device, oldest dropped first), or
  // stops it (the trace is kept for dump_snapshot). Attaches to / detaches from every allocator
  // that exists; Runtime attaches allocators created later (attach_if_recording).
  void record(bool enabled, size_t max_entries);
  bool recording() const noexcept { return recording_.load(std::memory_order_acquire); }
  void attach_if_recording(core::DeviceAllocator& a);

  std::vector<TraceEntry> trace(int device) const;
  int devices_traced() const;

  void on_alloc(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept override;
  void on_free(int device, CUdeviceptr addr, size_t requested, CUstream stream) noexcept override;
  void on_map(int device, CUdeviceptr addr, size_t bytes) noexcept override;
  void on_unmap(int device, CUdeviceptr addr, size_t bytes) noexcept override;
  void on_oom(int device, size_t requested, CUstream stream, size_t free_bytes) noexcept override;

 private:
  History() = default;
  void add(int device, TraceEntry e) noexcept;

  mutable std::mutex mu_;
  std::atomic<bool> recording_{false};
  size_t max_entries_ = 0;
  std::vector<std::deque<TraceEntry>> traces_;
};

// The snapshot pickle of every device now: segments from the allocators that exist, the traces
// from History. Throws usage_error / driver_failure as Runtime::get() does.
std::string snapshot_pickle();
// Writes snapshot_pickle() to path; throws usage_error naming the path when it cannot.
void dump_snapshot(const std::string& path);

}  // namespace expanse::api
