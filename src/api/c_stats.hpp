// expanse_stats: filled from a device's allocator, and described field by field for bindings.
// Both come from the one list of fields, expanse/stats_fields.h.
#pragma once

#include "expanse/expanse.h"

namespace expanse::api {

// Fills out's first out->struct_size bytes (at most sizeof(expanse_stats)) with device's stats.
// Throws usage_error for a NULL out or a struct_size too small to hold struct_size itself.
void fill_stats(int device, expanse_stats* out);

// Field i of expanse_stats: its name and C type ("uint64_t", "uint64_t[64]"); nullptr past the end.
const char* stats_field_name(int i) noexcept;
const char* stats_field_type(int i) noexcept;

}  // namespace expanse::api
