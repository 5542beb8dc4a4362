// Driver calls a model of an allocator would have made, counted by name and priced with
// expanse's driver cost model (src/driver_api/cost_model.hpp), so that PyTorch's allocators and
// expanse are compared on one scale.
#pragma once

#include "driver_api/entry_points.hpp"

#include <cstdint>
#include <map>
#include <string>

namespace expanse::replay {

class DriverTally {
 public:
  // One VMM driver call touching `bytes` of physical memory over `mappings` handles
  // (0 bytes: not a per-size call).
  void vmm(driver::EntryPoint e, uint64_t bytes, uint64_t mappings = 1);
  // cudaMalloc / cudaFree of `bytes`: counted as one call each, priced as the VMM calls the
  // runtime makes for them (reserve + create + map + set access; unmap + release + free).
  void cuda_malloc(uint64_t bytes);
  void cuda_free(uint64_t bytes);
  // cudaStreamSynchronize (before an expandable segment unmaps).
  void stream_synchronize();

  uint64_t total() const noexcept { return total_; }
  double seconds() const noexcept { return ns_ * 1e-9; }
  const std::map<std::string, uint64_t>& by_name() const noexcept { return calls_; }

 private:
  double price(driver::EntryPoint e, uint64_t bytes, uint64_t mappings = 1) const;
  void count(const std::string& name) {
    ++calls_[name];
    ++total_;
  }

  std::map<std::string, uint64_t> calls_;
  uint64_t total_ = 0;
  double ns_ = 0;
};

}  // namespace expanse::replay
