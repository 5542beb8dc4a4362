// The selftest's rule checks: each returns what it verified, or throws Failed with what the
// driver did instead. The runner makes the primary context current around each.
#pragma once

#include "selftest_env.hpp"

#include <string>
#include <vector>

namespace expanse::tools::selftest {

struct Check {
  const char* name;
  std::string (*run)(const Env&);
};

const std::vector<Check>& all_checks();

}  // namespace expanse::tools::selftest
