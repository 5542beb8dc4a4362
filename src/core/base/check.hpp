// Invariant asserts. EXPANSE_ASSERT(cond) states something the allocator's books guarantee at
// that point. Checked builds (-DEXPANSE_CHECKED=ON) report a violation on stderr and abort; debug
// builds use assert(); release builds compile it out (library code never aborts there).
#pragma once

#include <cassert>
#include <string>

namespace expanse::core {

// True in a checked build: DeviceAllocator runs check_invariants() after every public call that
// changes its books.
#ifdef EXPANSE_CHECKED
inline constexpr bool kCheckedBuild = true;
// Prints "expanse: invariant violated: <what> (<file>:<line>)" and aborts.
[[noreturn]] void invariant_failed(const char* what, const char* file, int line);
// Prints "expanse: invariant violated after <call>: <violation>" and aborts.
[[noreturn]] void books_violated(const char* call, const std::string& violation);
#else
inline constexpr bool kCheckedBuild = false;
#endif

}  // namespace expanse::core

#ifdef EXPANSE_CHECKED
#define EXPANSE_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::expanse::core::invariant_failed(#cond, __FILE__, __LINE__))
#else
#define EXPANSE_ASSERT(cond) assert(cond)
#endif
