#include "report/driver_floor.hpp"

#include <cassert>

namespace expanse::replay {

DriverFloor preexisting_driver_floor(const trace::Trace& t, uint64_t page,
                                     const driver::CostModel& costs) {
  DriverFloor f;
  if (page == 0) return f;
  for (uint64_t i = 0; i < t.preexisting && i < t.ops.size(); ++i) {
    const trace::TraceOp& op = t.ops[i];
    constexpr auto kAlloc = trace::TraceOp::Type::alloc;
    assert(op.type == kAlloc && "preexisting blocks come first, as allocations");
    if (op.type != kAlloc || op.size / page < 2) continue;
    const size_t inner = static_cast<size_t>((op.size / page - 1) * page);
    ++f.blocks;
    f.seconds += (costs.cost_ns(driver::EntryPoint::mem_create, inner) +
                  costs.cost_ns(driver::EntryPoint::mem_map, inner) +
                  costs.cost_ns(driver::EntryPoint::mem_set_access, inner)) *
                 1e-9;
  }
  return f;
}

}  // namespace expanse::replay
