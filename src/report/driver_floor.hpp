// The least modeled driver time any allocator that keeps invariant 1 exact must spend placing the
// blocks a trace starts with (those live before recording began, allocated first and with no free
// between them).
//
// Invariant 1 (docs/design.md, invariant 1) lets no handle lie under two live blocks, since a free
// page under a handle that a live block also covers could never be unmapped. So every page wholly
// inside a block is backed by handles of that block alone. A block of k >= 2 pages holds at least
// k - 1 whole pages wherever it starts; none of them can be mapped before the block is allocated by
// any handle that another block also needs, and the block must be accessible when allocate returns.
// Hence at least one cuMemCreate, one cuMemMap and one cuMemSetAccess over k - 1 pages per such
// block: with costs linear in bytes and a positive per-call part (the default table), one handle is
// the cheapest way to back them, and the default table prices cuMemSetAccess per mapping, so
// granting several blocks' handles at once saves nothing. A measured table (--cost-table) that is
// not linear may make the figure a little high; it is then an estimate, not a bound.
//
// PyTorch's expandable segments are not bound by it: their 20 MiB pages lie under many blocks.
// The figure says how much of a gap between expanse and them invariant 1 alone forces.
//
// live_set_driver_floor extends the argument to every moment of the trace. At any moment each
// live block of k >= 2 pages holds handles of its own over at least k - 1 whole pages, as above.
// A live block of at least one page and less than two touches either one page wholly (its own
// handle) or two or more pages, none of them inside another block's handles; a page is touched
// by at most two blocks of a page or more (one ending in it, one starting), so these blocks need
// at least one one-page handle each, apart from every other block's. Smaller blocks may share
// pages and count nothing. Every handle mapped at one moment was created, mapped and granted
// during the first pass (it starts with nothing mapped), so the most any moment needs bounds the
// first pass from below; the floor above is that sum at the moment the preexisting blocks are
// live, so this one is never below it. Same caveat for a measured table.
#pragma once

#include "driver_api/cost_model.hpp"
#include "trace/trace.hpp"

#include <cstdint>

namespace expanse::replay {

struct DriverFloor {
  uint64_t blocks = 0;  // preexisting blocks of at least two pages
  double seconds = 0;   // their least modeled driver time
};

DriverFloor preexisting_driver_floor(const trace::Trace& t, uint64_t page,
                                     const driver::CostModel& costs);

struct LiveSetFloor {
  uint64_t blocks = 0;  // blocks of a page or more live at the costliest moment
  uint64_t op = 0;      // that moment: after ops[op]
  double seconds = 0;   // what the handles they need at least cost to create, map and grant
};

LiveSetFloor live_set_driver_floor(const trace::Trace& t, uint64_t page,
                                   const driver::CostModel& costs);

// What creating, mapping and granting ceil(peak live / page) pages one page at a time costs: the
// price of backing the most a workload ever holds live with one-page handles, which a workload
// whose block boundaries move from step to step needs wherever a boundary may fall (a handle
// under two live blocks would strand pages, invariant 1). Priced on the peak of live bytes, not
// on what an allocator held, so that holding more cannot loosen it. Not a lower bound: handles
// that no boundary ever cuts (weights, optimizer state) may be larger and cheaper.
struct OnePageFloor {
  uint64_t pages = 0;  // ceil(peak live / page)
  double seconds = 0;
};

OnePageFloor one_page_driver_floor(uint64_t peak_live_bytes, uint64_t page,
                                   const driver::CostModel& costs);

}  // namespace expanse::replay
