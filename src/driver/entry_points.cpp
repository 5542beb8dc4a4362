#include "driver/entry_points.hpp"

#include "driver/driver_table.hpp"

namespace expanse::driver {
namespace {

struct EntryInfo {
  const char* name;
  const char* symbol;
  int version;
};

constexpr EntryInfo kEntries[] = {
#define EXPANSE_X(field, base, symbol, version) {base, #symbol, version},
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
};
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == static_cast<size_t>(kEntryPointCount));

}  // namespace

const char* entry_point_name(EntryPoint e) noexcept { return kEntries[static_cast<int>(e)].name; }
const char* entry_point_symbol(EntryPoint e) noexcept {
  return kEntries[static_cast<int>(e)].symbol;
}
int entry_point_version(EntryPoint e) noexcept { return kEntries[static_cast<int>(e)].version; }

void** DriverTable::slot(EntryPoint e) noexcept {
  switch (e) {
#define EXPANSE_X(field, base, symbol, version) \
  case EntryPoint::field:                       \
    return reinterpret_cast<void**>(&field);
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
  }
  return nullptr;
}

const char* DriverTable::first_missing() const noexcept {
#define EXPANSE_X(field, base, symbol, version) \
  if (field == nullptr) return base;
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
  return nullptr;
}

bool DriverTable::complete() const noexcept { return first_missing() == nullptr; }

}  // namespace expanse::driver
