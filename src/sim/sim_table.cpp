// The in-process sim's driver table: every listed entry point, as driver/ and the tests see it.
#include "sim/sim.hpp"
#include "sim/sim_entry.hpp"

namespace expanse::sim {

const driver::DriverTable& table() {
  static const driver::DriverTable t = [] {
    driver::DriverTable d;
#define EXPANSE_X(field, ...) d.field = &sim_##field;
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
    return d;
  }();
  return t;
}

}  // namespace expanse::sim
