// The RMM log CSV reader on any bytes: a Trace or an input_error, never a crash; a Trace is
// consistent (see trace_check.hpp).
#include "trace/trace.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "trace_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    if (!expanse::fuzz::trace_problem(expanse::trace::load_rmm_csv("fuzz.csv", in)).empty()) {
      std::abort();
    }
  } catch (const expanse::trace::input_error&) {
  }
  return 0;
}
