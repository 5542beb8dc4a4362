/* expanse — the fields of expanse_stats, with their meanings (C99; included by expanse.h).
 *
 * One list, in struct order. The struct in expanse.h, the allocator's own counters, the copy from
 * those into the struct and the names bindings read at run time (expanse_stats_field_name and
 * expanse_stats_field_type) are all made from it. Each line is one of
 *
 *   KEPT(type, name, doc)            kept up to date by the device's allocator as it runs
 *   FILLED(type, name, doc)          filled in when the stats are read (expanse_get_stats): sums,
 *                                    settings, and counts kept outside the allocator
 *   ARRAY(type, name, length, doc)   an array, filled in when the stats are read
 *
 * The list is an ABI. A new field goes at the end: a caller built against an older, shorter
 * struct stays valid, since expanse_get_stats writes nothing past the caller's struct_size. No
 * field is removed, moved or retyped. Adding a KEPT field takes its line here and the code that
 * keeps it; a FILLED or ARRAY field takes its line here and the line that fills it. */
#ifndef EXPANSE_STATS_FIELDS_H
#define EXPANSE_STATS_FIELDS_H

#include <stddef.h>
#include <stdint.h>

/* The length of expanse_stats.driver_calls: room for every driver entry point expanse calls. */
#define EXPANSE_MAX_ENTRY_POINTS 64

#define EXPANSE_STATS_FIELDS(KEPT, FILLED, ARRAY)                                                 \
  FILLED(size_t,   struct_size,              "sizeof(expanse_stats) as the caller knows it")      \
  KEPT(  uint64_t, requested_bytes,          "live bytes as asked")                               \
  KEPT(  uint64_t, allocated_bytes,          "live bytes as carved (512 B granularity)")          \
  KEPT(  uint64_t, touched_bytes,            "pages touched by live blocks, in bytes")            \
  KEPT(  uint64_t, mapped_bytes,             "pages mapped into VA, in bytes")                    \
  KEPT(  uint64_t, cached_bytes,             "mapped, touched by no live block")                  \
  KEPT(  uint64_t, pooled_bytes,             "physical pages held unmapped, ready to map")        \
  KEPT(  uint64_t, physical_bytes,           "mapped + pooled: all physical memory held")         \
  KEPT(  uint64_t, va_reserved_bytes,        "virtual address space reserved")                    \
  KEPT(  uint64_t, peak_requested_bytes,     "the most requested_bytes since peaks were reset")   \
  KEPT(  uint64_t, peak_allocated_bytes,     "the most allocated_bytes since peaks were reset")   \
  KEPT(  uint64_t, peak_mapped_bytes,        "the most mapped_bytes since peaks were reset")      \
  KEPT(  uint64_t, peak_physical_bytes,      "the most physical_bytes since peaks were reset")    \
  KEPT(  uint64_t, peak_va_reserved_bytes,   "the most va_reserved_bytes since peaks were reset") \
  KEPT(  uint64_t, live_blocks,              "blocks allocated and not yet freed")                \
  KEPT(  uint64_t, num_allocs,               "allocations that succeeded")                        \
  KEPT(  uint64_t, num_frees,                "blocks freed")                                      \
  KEPT(  uint64_t, num_ooms,                 "allocations that failed for lack of memory")        \
  KEPT(  uint64_t, num_reclaimed_pages,      "pages unmapped under free blocks, mapped elsewhere")\
  KEPT(  uint64_t, num_created_pages,        "physical pages created (cuMemCreate)")              \
  KEPT(  uint64_t, num_released_pages,       "physical pages given back to the driver")           \
  FILLED(uint64_t, driver_calls_total,       "the sum of driver_calls")                           \
  FILLED(double,   modeled_driver_seconds,   "the modeled GPU time of those calls")               \
  FILLED(uint64_t, page_size,                "the allocator's page, in bytes")                    \
  FILLED(uint64_t, capacity_bytes,           "the device's memory")                               \
  FILLED(uint64_t, limit_bytes,              "the cap of expanse_set_limit; UINT64_MAX if none")  \
  FILLED(uint32_t, num_entry_points,         "valid entries of driver_calls")                     \
  ARRAY( uint64_t, driver_calls, EXPANSE_MAX_ENTRY_POINTS,                                        \
                                             "calls per entry point (expanse_entry_point_name)")  \
  FILLED(uint64_t, num_free_size_mismatches, "expanse_torch_free calls whose size disagreed")     \
  FILLED(uint64_t, num_unknown_frees,        "expanse_torch_free calls of a pointer not live")    \
  KEPT(  uint64_t, reserved_bytes,           "physical memory held for the reservation")          \
  KEPT(  uint64_t, reserved_unused_bytes,    "reserved, touched by no live block")                \
  KEPT(  uint64_t, reserve_asked_bytes,      "the reservation asked; > reserved_bytes: partial")\
  KEPT(  uint64_t, physical_low_water_bytes, "least physical held since the reservation changed")\
  KEPT(  uint64_t, reserve_stranded_bytes,   "reserved pages no block can use: taken whole, retired")

#endif /* EXPANSE_STATS_FIELDS_H */
