// libFuzzer target: the whole C ABI and the sharing records, driven by libFuzzer's bytes through
// the same harnesses the seeded unit tests run (test/api/c_abi_fuzz.hpp, ipc_record_fuzz.hpp).
// The first byte picks the harness (and, for the C ABI, whether driver failures are injected);
// every later pair of bytes is one choice. A harness's violation aborts, so libFuzzer keeps the
// input; the library itself is built here with clang, instrumented for coverage and checked
// (EXPANSE_CHECKED: the books are verified after every call).
#include "../api/c_abi_fuzz.hpp"
#include "../api/ipc_record_fuzz.hpp"

#include <cstdio>
#include <cstdlib>

namespace {

void report_and_abort(const char* harness, const std::vector<std::string>& failures) {
  std::fprintf(stderr, "%s: %zu violations\n", harness, failures.size());
  for (const std::string& f : failures) std::fprintf(stderr, "  %s\n", f.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace expanse::test::fuzz;
  static const bool ready = [] {
    if (expanse_init(fuzz_conf()) != EXPANSE_OK) {
      std::fprintf(stderr, "expanse_init: %s\n", expanse_last_error());
      std::abort();
    }
    return true;
  }();
  (void)ready;
  if (size < 2) return 0;
  ByteChoices c(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
    case 1: {
      CAbiFuzzer f(0, true, data[0] % 3 == 1);
      f.run(c, size);  // until the bytes run out
      f.finish();
      if (!f.failures().empty()) report_and_abort("C ABI", f.failures());
      break;
    }
    default: {
      IpcRecordFuzzer f;
      f.run(c, size);
      f.finish();
      if (!f.failures().empty()) report_and_abort("sharing records", f.failures());
      break;
    }
  }
  return 0;
}
