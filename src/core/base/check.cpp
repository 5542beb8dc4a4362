#include "core/base/check.hpp"

#include <cstdio>
#include <cstdlib>

namespace expanse::core {

#ifdef EXPANSE_CHECKED
void invariant_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "expanse: invariant violated: %s (%s:%d)\n", what, file, line);
  std::abort();
}

void books_violated(const char* call, const std::string& violation) {
  std::fprintf(stderr, "expanse: invariant violated after %s: %s\n", call, violation.c_str());
  std::abort();
}
#endif

}  // namespace expanse::core
