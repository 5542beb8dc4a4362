#include "api/c_stats.hpp"

#include "api/runtime.hpp"
#include "api/torch_entry.hpp"
#include "expanse/errors.hpp"

#include <cstring>
#include <iterator>
#include <string>

namespace expanse::api {
namespace {

struct FieldInfo {
  const char* name;
  const char* type;
};

#define EXPANSE_STRINGIFY_(x) #x
#define EXPANSE_FIELD_INFO_(type, name, doc) {#name, #type},
#define EXPANSE_ARRAY_INFO_(type, name, length, doc) \
  {#name, #type "[" EXPANSE_STRINGIFY_(length) "]"},
constexpr FieldInfo kFields[] = {
    EXPANSE_STATS_FIELDS(EXPANSE_FIELD_INFO_, EXPANSE_FIELD_INFO_, EXPANSE_ARRAY_INFO_)};
#undef EXPANSE_STRINGIFY_
#undef EXPANSE_FIELD_INFO_
#undef EXPANSE_ARRAY_INFO_

constexpr int kFieldCount = static_cast<int>(std::size(kFields));

}  // namespace

void fill_stats(int device, expanse_stats* out) {
  if (out == nullptr) throw usage_error("expanse_get_stats: out is NULL");
  if (out->struct_size < sizeof(size_t)) {
    throw usage_error("expanse_get_stats: struct_size " + std::to_string(out->struct_size) +
                      " is too small; set it to sizeof(expanse_stats)");
  }
  Runtime& rt = Runtime::get();
  expanse_stats full{};
  full.struct_size = sizeof(expanse_stats);
  if (core::DeviceAllocator* a = rt.existing(device)) {
    const core::DeviceStats s = a->stats();
    // The allocator's own figures, field for field.
#define EXPANSE_COPY_KEPT_(type, name, doc) full.name = s.name;
#define EXPANSE_IGNORE_(...)
    EXPANSE_STATS_FIELDS(EXPANSE_COPY_KEPT_, EXPANSE_IGNORE_, EXPANSE_IGNORE_)
#undef EXPANSE_COPY_KEPT_
#undef EXPANSE_IGNORE_
    // The rest (FILLED and ARRAY in the list).
    full.driver_calls_total = s.total_driver_calls();
    full.modeled_driver_seconds = s.modeled_driver_ns * 1e-9;
    full.page_size = a->page_size();
    full.capacity_bytes = a->capacity();
    const size_t lim = a->limit();
    full.limit_bytes = lim == core::kNoLimit ? UINT64_MAX : lim;
    for (int i = 0; i < driver::kEntryPointCount; ++i) {
      full.driver_calls[i] = s.driver_calls[static_cast<size_t>(i)];
    }
  } else {
    // A device expanse never set up holds nothing, and setting it up to say so would retain a
    // CUDA context there: every figure 0, the capacity and the configured limit from the driver
    // and the configuration, page_size 0 (chosen at setup).
    const Runtime::Unset u = rt.before_setup(device);
    full.capacity_bytes = u.capacity;
    full.limit_bytes = u.limit == core::kNoLimit ? UINT64_MAX : u.limit;
  }
  static_assert(driver::kEntryPointCount <= EXPANSE_MAX_ENTRY_POINTS);
  full.num_entry_points = static_cast<uint32_t>(driver::kEntryPointCount);
  const TorchFreeCounts tc = torch_free_counts(device);
  full.num_free_size_mismatches = tc.size_mismatches;
  full.num_unknown_frees = tc.unknown;
  size_t n = out->struct_size < sizeof(expanse_stats) ? out->struct_size : sizeof(expanse_stats);
  size_t caller_size = out->struct_size;
  std::memcpy(out, &full, n);
  out->struct_size = caller_size < sizeof(expanse_stats) ? caller_size : sizeof(expanse_stats);
}

const char* stats_field_name(int i) noexcept {
  return i >= 0 && i < kFieldCount ? kFields[i].name : nullptr;
}

const char* stats_field_type(int i) noexcept {
  return i >= 0 && i < kFieldCount ? kFields[i].type : nullptr;
}

}  // namespace expanse::api
