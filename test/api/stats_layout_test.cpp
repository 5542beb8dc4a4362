// expanse_stats is an ABI. Its fields come from one list (expanse/stats_fields.h); this file holds
// the layout as first released, written out by hand, and checks that the struct made from the
// list keeps every one of those fields at the same offset with the same type, growing only at its
// end, and that the names and types the library lists at run time are the struct's.
#include "expanse/expanse.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>

namespace {

using U64x64 = uint64_t[64];

// F(name, C type as expanse_stats_field_type spells it, C++ type)
#define RELEASED_STATS_FIELDS(F)                     \
  F(struct_size, "size_t", size_t)                   \
  F(requested_bytes, "uint64_t", uint64_t)           \
  F(allocated_bytes, "uint64_t", uint64_t)           \
  F(touched_bytes, "uint64_t", uint64_t)             \
  F(mapped_bytes, "uint64_t", uint64_t)              \
  F(cached_bytes, "uint64_t", uint64_t)              \
  F(pooled_bytes, "uint64_t", uint64_t)              \
  F(physical_bytes, "uint64_t", uint64_t)            \
  F(va_reserved_bytes, "uint64_t", uint64_t)         \
  F(peak_requested_bytes, "uint64_t", uint64_t)      \
  F(peak_allocated_bytes, "uint64_t", uint64_t)      \
  F(peak_mapped_bytes, "uint64_t", uint64_t)         \
  F(peak_physical_bytes, "uint64_t", uint64_t)       \
  F(peak_va_reserved_bytes, "uint64_t", uint64_t)    \
  F(live_blocks, "uint64_t", uint64_t)               \
  F(num_allocs, "uint64_t", uint64_t)                \
  F(num_frees, "uint64_t", uint64_t)                 \
  F(num_ooms, "uint64_t", uint64_t)                  \
  F(num_reclaimed_pages, "uint64_t", uint64_t)       \
  F(num_created_pages, "uint64_t", uint64_t)         \
  F(num_released_pages, "uint64_t", uint64_t)        \
  F(driver_calls_total, "uint64_t", uint64_t)        \
  F(modeled_driver_seconds, "double", double)        \
  F(page_size, "uint64_t", uint64_t)                 \
  F(capacity_bytes, "uint64_t", uint64_t)            \
  F(limit_bytes, "uint64_t", uint64_t)               \
  F(num_entry_points, "uint32_t", uint32_t)          \
  F(driver_calls, "uint64_t[64]", U64x64)            \
  F(num_free_size_mismatches, "uint64_t", uint64_t)  \
  F(num_unknown_frees, "uint64_t", uint64_t)

struct ReleasedStats {
#define MEMBER(name, spelled, T) T name;
  RELEASED_STATS_FIELDS(MEMBER)
#undef MEMBER
};

#define SAME_PLACE_AND_TYPE(name, spelled, T)                                  \
  static_assert(offsetof(expanse_stats, name) == offsetof(ReleasedStats, name), \
                #name " moved");                                               \
  static_assert(std::is_same_v<decltype(expanse_stats::name), T>, #name " changed type");
RELEASED_STATS_FIELDS(SAME_PLACE_AND_TYPE)
#undef SAME_PLACE_AND_TYPE
static_assert(sizeof(expanse_stats) >= sizeof(ReleasedStats), "expanse_stats shrank");
static_assert(alignof(expanse_stats) == alignof(ReleasedStats));

struct NameAndType {
  const char* name;
  const char* type;
};
constexpr NameAndType kReleased[] = {
#define NAME_AND_TYPE(name, spelled, T) {#name, spelled},
    RELEASED_STATS_FIELDS(NAME_AND_TYPE)
#undef NAME_AND_TYPE
};

TEST(StatsLayout, LibraryListsTheReleasedFieldsFirstInOrder) {
  int i = 0;
  for (const NameAndType& f : kReleased) {
    ASSERT_NE(expanse_stats_field_name(i), nullptr) << "field " << i << " (" << f.name << ")";
    EXPECT_STREQ(expanse_stats_field_name(i), f.name) << "field " << i;
    EXPECT_STREQ(expanse_stats_field_type(i), f.type) << f.name;
    ++i;
  }
}

TEST(StatsLayout, LibraryListsEveryFieldOfTheStructAndNoMore) {
  int listed = 0;
  while (expanse_stats_field_name(listed) != nullptr) {
    EXPECT_NE(expanse_stats_field_type(listed), nullptr) << expanse_stats_field_name(listed);
    ++listed;
  }
#define COUNT(...) +1
  constexpr int in_struct = 0 EXPANSE_STATS_FIELDS(COUNT, COUNT, COUNT);
#undef COUNT
  EXPECT_EQ(listed, in_struct);
  EXPECT_EQ(expanse_stats_field_name(-1), nullptr);
  EXPECT_EQ(expanse_stats_field_type(-1), nullptr);
  EXPECT_EQ(expanse_stats_field_type(listed), nullptr);
}

}  // namespace
