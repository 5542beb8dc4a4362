// Tests that run out of host memory: each test is instantiated failing the n-th host allocation
// of the call under test and every later one (FromThenOn), or that one only (Once), and sweeps n
// (test/support/host_alloc_failure.hpp).
#pragma once

#include "core_fixture.hpp"
#include "support/host_alloc_failure.hpp"

#include <cstdint>
#include <new>
#include <ostream>
#include <string>

namespace expanse::test {

struct Failing {
  size_t count;  // how many allocations fail from the n-th (SIZE_MAX: all of them)
  const char* name;
};

inline void PrintTo(const Failing& f, std::ostream* os) { *os << f.name; }

class HostMemoryFailureTest : public CoreTest, public ::testing::WithParamInterface<Failing> {
 protected:
  // Runs op with this thread's host allocations failing from the n-th on (as GetParam() says).
  struct Run {
    bool threw = false;   // op threw std::bad_alloc
    bool failed = false;  // some allocation failed
  };
  template <class Op>
  Run failing_from(size_t n, Op&& op) {
    Run r;
    HostAllocFailure fail(n, GetParam().count);
    try {
      op();
    } catch (const std::bad_alloc&) {
      r.threw = true;
    }
    r.failed = fail.failed() != 0;
    return r;
  }
};

}  // namespace expanse::test

// Instantiates the HostMemoryFailureTest subclass `fixture` in both ways of failing.
#define EXPANSE_INSTANTIATE_FAILING(fixture)                                                  \
  INSTANTIATE_TEST_SUITE_P(                                                                  \
      Failing, fixture,                                                                      \
      ::testing::Values(::expanse::test::Failing{SIZE_MAX, "FromThenOn"},                    \
                        ::expanse::test::Failing{1, "Once"}),                                \
      [](const ::testing::TestParamInfo<::expanse::test::Failing>& p) {                      \
        return std::string(p.param.name);                                                    \
      })
