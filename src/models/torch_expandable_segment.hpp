// One expandable segment of PyTorch's allocator with expandable_segments:True: a virtual range
// of 9/8 x device memory, backed page by page (2 MiB pages for the small pool, 20 MiB for the
// large) with one cuMemCreate + cuMemMap per page and one cuMemSetAccess per mapped range, and
// unmapped page by page (after a stream synchronize) when cached memory is released.
#pragma once

#include "models/device_memory.hpp"
#include "models/driver_tally.hpp"

#include <cstdint>
#include <vector>

namespace expanse::replay {

class TorchExpandableSegment {
 public:
  TorchExpandableSegment(uint64_t base, uint64_t page, uint64_t device_bytes, uint64_t stream);

  uint64_t base() const noexcept { return base_; }
  uint64_t size() const noexcept { return page_ * max_pages_; }
  uint64_t page() const noexcept { return page_; }
  uint64_t stream() const noexcept { return stream_; }
  uint64_t mapped_bytes() const noexcept { return mapped_pages_ * page_; }

  // Maps the pages covering [ptr, ptr + size) (ptr page-aligned, pages unmapped). Returns the
  // bytes mapped (whole pages), or 0 when the device ran out of memory: the pages created so far
  // are released again, as PyTorch does.
  uint64_t map(uint64_t ptr, uint64_t size, DeviceMemory& mem, DriverTally& calls);

  struct Range {
    uint64_t ptr = 0;
    uint64_t size = 0;
  };
  // Unmaps the pages lying wholly inside [ptr, ptr + size); size 0 when there are none.
  Range unmap(uint64_t ptr, uint64_t size, DeviceMemory& mem, DriverTally& calls);

 private:
  uint64_t base_;
  uint64_t page_;
  uint64_t max_pages_;
  uint64_t stream_;
  uint64_t mapped_pages_ = 0;
  std::vector<bool> mapped_;  // per page
};

}  // namespace expanse::replay
