// `expanse stress`: fragment a device with an inference server's mix of allocations, then ask
// for one contiguous block while enough physical memory is free, and check its every page.
#pragma once

#include "conf/config.hpp"
#include "core/base/device_stats.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace expanse::replay {

struct StressOptions {
  size_t capacity = 0;  // sim: device capacity (0: EXPANSE_CONF sim_capacity, default 80 GiB);
                        // real GPU: a limit on what the allocator may hold (0: none)
  size_t size = 0;      // the contiguous block (0: 2/5 of the capacity, 32 GiB on 80 GiB)
  uint64_t seed = 1;
  int streams = 4;
  std::string conf;  // EXPANSE_CONF
  std::string reserve;  // EXPANSE_CONF reserve (a size, a fraction, free); "" none or the conf's
  // With a reservation, run the same workload again without it, for the request's driver calls
  // and modeled time side by side (StressResult::unreserved).
  bool unreserved_baseline = true;
  // Sim only: a greedy neighbour, another process on the device that takes every free byte after
  // each cuMemRelease. With a reservation, the run is made once more with one-page reserved
  // handles (reserve_handle_size: the page), which are never reshaped, for the figures side by
  // side (StressResult::one_page_handles). The unreserved baseline runs alone.
  bool neighbour = false;
  std::function<void(double fraction, const std::string& phase)> progress;
};

struct StressResult {
  std::string driver;  // LoadedDriver::description()
  bool sim = false;
  size_t capacity = 0;
  size_t page_size = 0;
  size_t size = 0;
  uint64_t seed = 0;
  int streams = 0;

  // The fragmenting workload.
  uint64_t workload_allocs = 0;
  uint64_t workload_frees = 0;
  uint64_t workload_ooms = 0;      // requests the workload made that did not fit (skipped)
  uint64_t live_blocks_before = 0;  // at the moment of the big request
  uint64_t live_bytes_before = 0;
  uint64_t touched_bytes_before = 0;
  uint64_t mapped_bytes_before = 0;
  uint64_t cached_bytes_before = 0;   // mapped under free memory, scattered between live blocks
  uint64_t free_physical_before = 0;  // capacity - pages touched by live blocks
  double workload_seconds = 0;

  // The big request.
  bool allocated = false;
  std::string error;  // why not, or why it was not verified
  double alloc_seconds = 0;
  uint64_t pages_reclaimed = 0;  // pages unmapped under free memory and mapped into the block
  uint64_t pages_created = 0;
  core::DeviceStats calls;       // driver_calls / modeled_driver_ns of the big request alone
  uint64_t reserved_bytes = 0;   // the reservation held at the big request (EXPANSE_CONF reserve)
  uint64_t reserve_asked_bytes = 0;
  // The least physical memory held since the reservation was made (stats'
  // physical_low_water_bytes, read after the last free): never below reserved_bytes, unless
  // reserve_may_dip lets it.
  uint64_t physical_low_water_bytes = 0;
  uint64_t stranded_bytes = 0;   // reserved pages the request took whole beyond its size
  uint64_t neighbour_bytes = 0;  // what the neighbour held when the request was made
  bool verified = false;
  uint64_t pages_verified = 0;
  uint64_t live_blocks_verified = 0;
  double verify_seconds = 0;
  size_t host_resident_bytes = 0;  // sim: host RAM behind device pages at the end

  core::DeviceStats stats;  // whole run
  double wall_seconds = 0;

  // The same run (workload, seed, device) made another way, for its figures beside this one's.
  struct OtherRun {
    bool ran = false;
    bool allocated = false;
    double alloc_seconds = 0;
    uint64_t pages_reclaimed = 0;
    uint64_t pages_created = 0;
    uint64_t physical_low_water_bytes = 0;
    uint64_t stranded_bytes = 0;
    core::DeviceStats calls;  // the big request's
    core::DeviceStats stats;  // whole run
  };
  bool neighbour = false;
  OtherRun unreserved;        // with a reservation: without it (and without the neighbour)
  OtherRun one_page_handles;  // with a reservation and the neighbour: reserved handles of a page
};

// Throws expanse::usage_error for a bad option (size larger than the device), driver errors.
StressResult run_stress(const StressOptions& o);

}  // namespace expanse::replay
