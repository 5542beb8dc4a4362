#include "driver_api/driver_table.hpp"

namespace expanse::driver {
namespace {

// The first entry point left unfilled among those `wanted` picks, by base name, or nullptr.
template <class Wanted>
const char* first_unfilled(const DriverTable& t, Wanted wanted) noexcept {
  for (int i = 0; i < kEntryPointCount; ++i) {
    const auto e = static_cast<EntryPoint>(i);
    if (wanted(e) && !t.has(e)) return entry_point_name(e);
  }
  return nullptr;
}

}  // namespace

void** DriverTable::slot(EntryPoint e) noexcept {
  switch (e) {
#define EXPANSE_X(field, ...) \
  case EntryPoint::field:     \
    return reinterpret_cast<void**>(&field);
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
  }
  return nullptr;
}

const char* DriverTable::first_missing() const noexcept {
  return first_unfilled(*this, [](EntryPoint) { return true; });
}

const char* DriverTable::first_missing_required() const noexcept {
  return first_unfilled(*this, entry_point_required);
}

bool DriverTable::complete() const noexcept { return first_missing() == nullptr; }

bool DriverTable::has(EntryPoint e) const noexcept {
  void* const* p = const_cast<DriverTable*>(this)->slot(e);
  return p != nullptr && *p != nullptr;
}

}  // namespace expanse::driver
