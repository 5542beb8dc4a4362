// DeviceAllocator's reservation: physical memory taken up front and held, used or not
// (PageSupply::reserve; docs/design.md, "Reservations").
#include "conf/env_config.hpp"
#include "core/device_allocator.hpp"
#include "core/pages/handle_plan.hpp"
#include "expanse/errors.hpp"

#include <algorithm>

namespace expanse::core {

using conf::format_size;

// How many cuts of the largest reserved handle the room left after a reservation holds.
constexpr size_t kReserveCutsInRoom = 1;

size_t DeviceAllocator::reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "reserve");
  reserve_pending_ = false;
  return reserve_locked(bytes, opts_.reserve_partial);
}

void DeviceAllocator::reserve_pending_locked() {
  // Tried again at the next allocation when it throws: the memory may be free by then.
  reserve_locked(opts_.reserve_free ? kReserveFree : opts_.reserve_bytes, opts_.reserve_partial);
  reserve_pending_ = false;
}

DeviceAllocator::ReserveState DeviceAllocator::reservation() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReserveState s;
  s.reserved_bytes = supply_.reserved_pages() * page_;
  s.asked_bytes = supply_.reserve_asked_pages() * page_;
  s.unused_bytes = supply_.reserved_unused_pages() * page_;
  s.pending = reserve_pending_;
  if (s.pending) s.asked_bytes = opts_.reserve_free ? 0 : opts_.reserve_bytes / page_ * page_;
  return s;
}

size_t DeviceAllocator::reserve_locked(size_t bytes, bool partial) {
  const std::string where = "expanse: reserve on device " + std::to_string(device());
  const size_t held = supply_.held_pages();
  const size_t cap = std::min(supply_.capacity_pages(), supply_.limit_pages());
  size_t free_bytes = 0;  // what the driver said was free, when growing
  size_t pages = 0;
  try {
    if (bytes == kReserveFree) {
      free_bytes = drv_.free_memory();
      const size_t avail = free_bytes > opts_.reserve_margin ? free_bytes - opts_.reserve_margin : 0;
      pages = std::min(held + avail / page_, cap);
      if (avail / page_ == 0 && held == 0 && !partial) {
        throw out_of_memory(where + ": asked all free memory less the margin of " +
                                format_size(opts_.reserve_margin) + ", but the driver has " +
                                format_size(free_bytes) + " free (" +
                                format_size(capacity() - std::min(capacity(), free_bytes)) +
                                " of " + format_size(capacity()) +
                                " taken); nothing is held (reserve_partial:true keeps what can be "
                                "had)",
                            0, device());
      }
    } else {
      pages = bytes / page_;
      if (pages > supply_.limit_pages()) {
        throw usage_error(where + ": " + format_size(pages * page_) + " is above the limit of " +
                          format_size(supply_.limit_pages() * page_) +
                          " (raise the limit first); nothing was changed");
      }
      if (pages > supply_.capacity_pages()) {
        throw usage_error(where + ": " + format_size(pages * page_) + " is more than the device's " +
                          format_size(capacity()) + "; nothing was changed");
      }
      if (pages > held) free_bytes = drv_.free_memory();
    }
    if (pages < supply_.reserved_pages()) streams_.poll(true);  // shrinking: free memory proven
    // Large handles by default: cut once for smaller blocks (page_gathering.cpp), they map a
    // large block in a few calls and the reservation costs a few cuMemCreate to make.
    size_t handle = max_handle_pages(page_, opts_.max_handle_size);
    if (opts_.reserve_handle_size != 0) {
      handle = std::min(handle, max_handle_pages(page_, opts_.reserve_handle_size));
    } else if (pages <= held) {
      handle = supply_.reserve_handle_pages();  // nothing is created: the shape stays
    } else if (!opts_.reserve_may_dip) {
      // A reserved handle is reshaped by creating its new shapes before releasing it, in the
      // room others have left (PageSupply::may_release): handles no larger than half of what
      // stays free after the reservation, so that while that margin is free a cut finds room.
      const size_t taken = (pages - held) * page_;
      size_t after = free_bytes > taken ? free_bytes - taken : 0;
      if (supply_.limit_pages() != SIZE_MAX) {
        after = std::min(after, (supply_.limit_pages() - pages) * page_);
      }
      size_t fit = 1;
      while (fit * 2 * page_ <= after / kReserveCutsInRoom) fit *= 2;
      handle = std::min(handle, fit);
    }
    const PageSupply::ReserveOutcome r = supply_.reserve(pages, handle, partial);
    if (!r.whole && !partial) {
      throw out_of_memory(
          where + ": asked " + format_size(pages * page_) + " (this allocator held " +
              format_size(r.held_before * page_) + "); the driver had " + format_size(free_bytes) +
              " free (" + format_size(capacity() - std::min(capacity(), free_bytes)) + " of " +
              format_size(capacity()) + " taken) and ran out of memory before all of it was "
              "created; nothing is held for it (reserve_partial:true keeps what can be had)",
          (pages - std::min(pages, r.held_before)) * page_, device());
    }
    drv_.reset_low_water();  // the promise is kept from here (physical_low_water_bytes)
    return r.got * page_;
  } catch (const driver::driver_error& e) {
    throw driver_failure(where + " (" + format_size(pages * page_) + "): " + e.what() +
                             "; nothing is held for it",
                         static_cast<int>(e.code()));
  }
}

}  // namespace expanse::core
