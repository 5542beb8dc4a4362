// Modeled GPU driver time per call. Defaults: the A100 figures of DESIGN.md (kvcached bench);
// map/unmap/create/set-access scale with the number of pages they touch.
#pragma once

#include "driver/entry_points.hpp"

#include <cstddef>

namespace expanse::driver {

struct CostModel {
  double per_call_ns[kEntryPointCount] = {};
  bool per_page[kEntryPointCount] = {};  // cost is per granularity page touched

  static const CostModel& a100() noexcept;
  // Nanoseconds for one successful call touching `pages` pages (ignored unless per_page).
  double cost_ns(EntryPoint e, size_t pages = 1) const noexcept {
    int i = static_cast<int>(e);
    return per_page[i] ? per_call_ns[i] * static_cast<double>(pages) : per_call_ns[i];
  }
};

}  // namespace expanse::driver
