// The snapshot interpreter on any bytes (mostly pickles mutated from real snapshots): a Trace or
// an input_error, never a crash; a Trace is consistent (blocks allocated once, freed at most
// once after their allocation, streams named by index, peak live as the ops say).
#include "trace/trace.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "trace_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    if (!expanse::fuzz::trace_problem(expanse::trace::load_snapshot("fuzz.pickle", in)).empty()) {
      std::abort();
    }
  } catch (const expanse::trace::input_error&) {
  }
  return 0;
}
