#include "replay/driver_tally.hpp"

#include "driver/cost_model.hpp"

namespace expanse::replay {
namespace {

using driver::EntryPoint;
// The cost model prices per-size calls per granularity page (2 MiB on the A100 it describes).
constexpr uint64_t kCostPage = uint64_t{2} << 20;

}  // namespace

double DriverTally::price(EntryPoint e, uint64_t bytes) const {
  const uint64_t pages = bytes == 0 ? 1 : (bytes + kCostPage - 1) / kCostPage;
  return driver::CostModel::a100().cost_ns(e, static_cast<size_t>(pages));
}

void DriverTally::vmm(EntryPoint e, uint64_t bytes) {
  count(driver::entry_point_name(e));
  ns_ += price(e, bytes);
}

void DriverTally::cuda_malloc(uint64_t bytes) {
  count("cudaMalloc");
  ns_ += price(EntryPoint::mem_address_reserve, 0) + price(EntryPoint::mem_create, bytes) +
         price(EntryPoint::mem_map, bytes) + price(EntryPoint::mem_set_access, bytes);
}

void DriverTally::cuda_free(uint64_t bytes) {
  count("cudaFree");
  ns_ += price(EntryPoint::ctx_synchronize, 0) + price(EntryPoint::mem_unmap, bytes) +
         price(EntryPoint::mem_release, 0) + price(EntryPoint::mem_address_free, 0);
}

void DriverTally::stream_synchronize() {
  count("cuStreamSynchronize");
  ns_ += price(EntryPoint::stream_synchronize, 0);
}

}  // namespace expanse::replay
