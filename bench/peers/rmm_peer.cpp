// RMM's pool_memory_resource and arena_memory_resource over cuda_memory_resource (cudaMalloc),
// the memory they take from cudaMalloc counted by a statistics_resource_adaptor between them.
// RMM 26's resources (cuda::mr::shared_resource values: a copy shares its state, so the counter
// kept here is the one under the pool). Neither returns memory while blocks are live (the pool's
// release frees live blocks too), so an inferred empty_cache() is nothing for them: that is how
// RMM behaves under such a workload.
#include "peers/peer.hpp"

#include <rmm/aligned.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>

#include <cuda/stream_ref>

#include <memory>
#include <optional>
#include <utility>

namespace expanse::peers {
namespace {

template <class Resource>
class RmmPeer final : public Peer {
 public:
  RmmPeer(Resource mr, rmm::mr::statistics_resource_adaptor counted, const char* source)
      : counted_(std::move(counted)), mr_(std::move(mr)), source_(source) {}

  void* allocate(size_t bytes, Stream s) override {
    try {
      return mr_.allocate(cuda::stream_ref{s}, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    } catch (const rmm::out_of_memory&) {
      return nullptr;
    }
  }
  void deallocate(void* p, size_t bytes, Stream s) override {
    mr_.deallocate(cuda::stream_ref{s}, p, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  void release_cached() override {}
  // A fresh resource for each workload (peers_bench.cpp): its counter starts at zero.
  void reset_peak() override {}
  uint64_t peak_reserved() override {
    return static_cast<uint64_t>(counted_.get_bytes_counter().peak);
  }
  const char* peak_source() const override { return source_; }

 private:
  rmm::mr::statistics_resource_adaptor counted_;
  Resource mr_;
  const char* source_;
};

rmm::mr::statistics_resource_adaptor counted_cuda() {
  return rmm::mr::statistics_resource_adaptor{rmm::mr::cuda_memory_resource{}};
}

}  // namespace

// Pool: starts empty and grows from cudaMalloc as needed (no maximum).
std::unique_ptr<Peer> make_rmm_pool_peer() {
  auto counted = counted_cuda();
  rmm::mr::pool_memory_resource pool{counted, 0};
  return std::make_unique<RmmPeer<rmm::mr::pool_memory_resource>>(
      std::move(pool), std::move(counted),
      "statistics_resource_adaptor under the pool: peak bytes from cudaMalloc");
}

// Arena: RMM's default global arena size (half the device memory free at construction).
std::unique_ptr<Peer> make_rmm_arena_peer() {
  auto counted = counted_cuda();
  rmm::mr::arena_memory_resource arena{counted};
  return std::make_unique<RmmPeer<rmm::mr::arena_memory_resource>>(
      std::move(arena), std::move(counted),
      "statistics_resource_adaptor under the arena: peak bytes from cudaMalloc");
}

}  // namespace expanse::peers
