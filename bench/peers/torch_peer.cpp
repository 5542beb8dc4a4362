// PyTorch's caching allocator from C++ (libc10_cuda.so of an installed torch), the one
// torch.cuda uses. Plain or expandable segments: PYTORCH_CUDA_ALLOC_CONF, which the allocator
// reads once, so each setting runs in its own process (peer_kinds.cpp).
#include "peers/peer.hpp"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace expanse::peers {
namespace {

class TorchPeer final : public Peer {
 public:
  TorchPeer() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) n = 1;
    // What torch.cuda's lazy initialization does first; once per process (a peer is made
    // afresh for each workload, the allocator is process-wide).
    static const bool once = (c10::cuda::CUDACachingAllocator::init(n), true);
    (void)once;
  }
  void* allocate(size_t bytes, Stream s) override {
    try {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, s);
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;
    }
  }
  void deallocate(void* p, size_t, Stream) override {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  }
  void release_cached() override { c10::cuda::CUDACachingAllocator::emptyCache(); }
  void reset_peak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(0); }
  uint64_t peak_reserved() override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<uint64_t>(stats.reserved_bytes[all].peak);
  }
  // Says which setting the allocator read, so a table cannot mislabel a column.
  const char* peak_source() const override {
    return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments()
               ? "getDeviceStats reserved_bytes.peak (expandable_segments on)"
               : "getDeviceStats reserved_bytes.peak (expandable_segments off)";
  }
};

}  // namespace

std::unique_ptr<Peer> make_torch_peer() { return std::make_unique<TorchPeer>(); }

}  // namespace expanse::peers
