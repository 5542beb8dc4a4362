#include "models/torch_expandable_segment.hpp"

namespace expanse::replay {

using driver::EntryPoint;

TorchExpandableSegment::TorchExpandableSegment(uint64_t base, uint64_t page, uint64_t device_bytes,
                                               uint64_t stream)
    : base_(base), page_(page), stream_(stream) {
  const uint64_t va = device_bytes + device_bytes / 8;  // room to move pages to the end
  max_pages_ = (va + page - 1) / page;
  if (max_pages_ == 0) max_pages_ = 1;
}

uint64_t TorchExpandableSegment::map(uint64_t ptr, uint64_t size, DeviceMemory& mem,
                                     DriverTally& calls) {
  const uint64_t begin = (ptr - base_) / page_;
  uint64_t end = (ptr - base_ + size + page_ - 1) / page_;
  if (end > max_pages_) end = max_pages_;
  if (begin >= end) return 0;
  if (mapped_.size() < end) mapped_.resize(end, false);
  for (uint64_t i = begin; i < end; ++i) {
    calls.vmm(EntryPoint::mem_create, page_);
    if (!mem.take(page_)) {
      for (uint64_t j = begin; j < i; ++j) {
        calls.vmm(EntryPoint::mem_release, page_);
        mem.give(page_);
      }
      return 0;
    }
  }
  for (uint64_t i = begin; i < end; ++i) {
    calls.vmm(EntryPoint::mem_map, page_);
    mapped_[i] = true;
  }
  calls.vmm(EntryPoint::mem_set_access, (end - begin) * page_, end - begin);
  mapped_pages_ += end - begin;
  return (end - begin) * page_;
}

TorchExpandableSegment::Range TorchExpandableSegment::unmap(uint64_t ptr, uint64_t size,
                                                            DeviceMemory& mem, DriverTally& calls) {
  const uint64_t begin = (ptr - base_ + page_ - 1) / page_;
  const uint64_t end = (ptr - base_ + size) / page_;
  if (begin >= end) return {ptr, 0};
  calls.stream_synchronize();  // unmapping does not wait for the stream's work by itself
  for (uint64_t i = begin; i < end; ++i) {
    calls.vmm(EntryPoint::mem_unmap, page_);
    calls.vmm(EntryPoint::mem_release, page_);
    mapped_[i] = false;
    mem.give(page_);
  }
  mapped_pages_ -= end - begin;
  return {base_ + begin * page_, (end - begin) * page_};
}

}  // namespace expanse::replay
