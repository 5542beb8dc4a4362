#include "driver_api/entry_points.hpp"

namespace expanse::driver {
namespace {

constexpr bool required = true;
constexpr bool optional = false;

struct EntryInfo {
  const char* name;
  const char* symbol;
  int version;
  bool is_required;
};

constexpr EntryInfo kEntries[] = {
#define EXPANSE_X(field, base, symbol, version, need, ...) {base, #symbol, version, need},
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
bool entry_point_required(EntryPoint e) noexcept { return kEntries[static_cast<int>(e)].is_required; }

}  // namespace expanse::driver
