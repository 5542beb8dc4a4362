#include "report/driver_floor.hpp"

#include <cassert>
#include <vector>

namespace expanse::replay {

namespace {

// Create, map and grant one handle of `bytes`.
double one_handle_ns(const driver::CostModel& costs, size_t bytes) {
  return costs.cost_ns(driver::EntryPoint::mem_create, bytes) +
         costs.cost_ns(driver::EntryPoint::mem_map, bytes) +
         costs.cost_ns(driver::EntryPoint::mem_set_access, bytes);
}

}  // namespace

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
    f.seconds += one_handle_ns(costs, inner) * 1e-9;
  }
  return f;
}

LiveSetFloor live_set_driver_floor(const trace::Trace& t, uint64_t page,
                                   const driver::CostModel& costs) {
  LiveSetFloor f;
  if (page == 0) return f;
  std::vector<double> price(t.blocks, 0.0);  // ns, per live block that counts
  double now = 0;
  uint64_t counted = 0;
  for (uint64_t i = 0; i < t.ops.size(); ++i) {
    const trace::TraceOp& op = t.ops[i];
    if (op.block >= price.size()) continue;
    if (op.type == trace::TraceOp::Type::alloc) {
      const uint64_t k = op.size / page;
      if (k == 0) continue;
      price[op.block] = one_handle_ns(costs, static_cast<size_t>((k >= 2 ? k - 1 : 1) * page));
      now += price[op.block];
      ++counted;
    } else if (price[op.block] != 0) {
      now -= price[op.block];
      price[op.block] = 0;
      --counted;
    }
    if (now * 1e-9 > f.seconds) {
      f.seconds = now * 1e-9;
      f.blocks = counted;
      f.op = i;
    }
  }
  return f;
}

OnePageFloor one_page_driver_floor(uint64_t peak_live_bytes, uint64_t page,
                                   const driver::CostModel& costs) {
  OnePageFloor f;
  if (page == 0) return f;
  f.pages = (peak_live_bytes + page - 1) / page;
  f.seconds = static_cast<double>(f.pages) * one_handle_ns(costs, static_cast<size_t>(page)) * 1e-9;
  return f;
}

}  // namespace expanse::replay
