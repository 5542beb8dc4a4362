#include "models/driver_tally.hpp"

#include "driver_api/cost_model.hpp"

namespace expanse::replay {

using driver::EntryPoint;

double DriverTally::price(EntryPoint e, uint64_t bytes, uint64_t mappings) const {
  return driver::CostModel::get_default().cost_ns(e, static_cast<size_t>(bytes),
                                                  static_cast<size_t>(mappings));
}

void DriverTally::vmm(EntryPoint e, uint64_t bytes, uint64_t mappings) {
  count(driver::entry_point_name(e));
  ns_ += price(e, bytes, mappings);
}

void DriverTally::cuda_malloc(uint64_t bytes) {
  count("cudaMalloc");
  ns_ += price(EntryPoint::mem_address_reserve, 0) + price(EntryPoint::mem_create, bytes) +
         price(EntryPoint::mem_map, bytes) + price(EntryPoint::mem_set_access, bytes);
}

void DriverTally::cuda_free(uint64_t bytes) {
  count("cudaFree");
  ns_ += price(EntryPoint::ctx_synchronize, 0) + price(EntryPoint::mem_unmap, bytes) +
         price(EntryPoint::mem_release, bytes) + price(EntryPoint::mem_address_free, 0);
}

void DriverTally::stream_synchronize() {
  count("cuStreamSynchronize");
  ns_ += price(EntryPoint::stream_synchronize, 0);
}

}  // namespace expanse::replay
