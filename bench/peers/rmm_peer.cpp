// RMM's pool_memory_resource and arena_memory_resource over cuda_memory_resource (cudaMalloc),
// the memory they take from cudaMalloc counted by a statistics_resource_adaptor between them.
// Neither returns memory while blocks are live (the pool's release() frees live blocks too), so
// an inferred empty_cache() is nothing for them: that is how RMM behaves under such a workload.
#include "peers/peer.hpp"

#include <rmm/cuda_stream_view.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/device/arena_memory_resource.hpp>
#include <rmm/mr/device/cuda_memory_resource.hpp>
#include <rmm/mr/device/pool_memory_resource.hpp>
#include <rmm/mr/device/statistics_resource_adaptor.hpp>

#include <memory>
#include <optional>

namespace expanse::peers {
namespace {

using Upstream = rmm::mr::statistics_resource_adaptor<rmm::mr::cuda_memory_resource>;

template <class Resource>
class RmmPeer final : public Peer {
 public:
  template <class... Args>
  explicit RmmPeer(const char* source, Args... args)
      : counted_(&cuda_), mr_(&counted_, args...), source_(source) {}

  void* allocate(size_t bytes, Stream s) override {
    try {
      return mr_.allocate(bytes, rmm::cuda_stream_view{s});
    } catch (const rmm::out_of_memory&) {
      return nullptr;
    }
  }
  void deallocate(void* p, size_t bytes, Stream s) override {
    mr_.deallocate(p, bytes, rmm::cuda_stream_view{s});
  }
  void release_cached() override {}
  // A fresh resource for each workload (peers_bench.cpp): its counter starts at zero.
  void reset_peak() override {}
  uint64_t peak_reserved() override {
    return static_cast<uint64_t>(counted_.get_bytes_counter().peak);
  }
  const char* peak_source() const override { return source_; }

 private:
  rmm::mr::cuda_memory_resource cuda_;
  Upstream counted_;
  Resource mr_;
  const char* source_;
};

}  // namespace

// Pool: starts empty and grows from cudaMalloc as needed (no maximum).
std::unique_ptr<Peer> make_rmm_pool_peer() {
  return std::make_unique<RmmPeer<rmm::mr::pool_memory_resource<Upstream>>>(
      "statistics_resource_adaptor under the pool: peak bytes from cudaMalloc", size_t{0},
      std::optional<size_t>{});
}

// Arena: RMM's default global arena size (half the device memory free at construction).
std::unique_ptr<Peer> make_rmm_arena_peer() {
  return std::make_unique<RmmPeer<rmm::mr::arena_memory_resource<Upstream>>>(
      "statistics_resource_adaptor under the arena: peak bytes from cudaMalloc",
      std::optional<size_t>{}, false);
}

}  // namespace expanse::peers
