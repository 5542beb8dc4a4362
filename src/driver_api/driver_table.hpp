// The seam to the hardware: a table of driver entry points filled at run time.
//
// Nothing above driver/ calls the CUDA driver any other way. A table comes either from the real
// libcuda.so.1 (dlopen + cuGetProcAddress_v2) or from the in-process sim; the code that uses it
// cannot tell which, which is the point.
#pragma once

#include "driver_api/entry_points.hpp"

namespace expanse::driver {

struct DriverTable {
#define EXPANSE_X(field, base, symbol, version, need, ...) decltype(&::symbol) field = nullptr;
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X

  // The entry point at index e, type-erased (for loaders that fill the table generically).
  void** slot(EntryPoint e) noexcept;
  // True when every entry point is filled, optional ones included.
  bool complete() const noexcept;
  // The first entry point left unfilled (optional ones included), or nullptr.
  const char* first_missing() const noexcept;
  // The first required entry point left unfilled, or nullptr.
  const char* first_missing_required() const noexcept;
  // True when entry point e is filled.
  bool has(EntryPoint e) const noexcept;
};

}  // namespace expanse::driver
