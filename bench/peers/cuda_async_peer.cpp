// cudaMallocAsync / cudaFreeAsync on the device's default memory pool, its release threshold
// raised to UINT64_MAX so freed memory stays cached (the default, 0, returns it at every
// synchronization, which no caching allocator does).
#include "peers/cuda_check.hpp"
#include "peers/peer.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace expanse::peers {
namespace {

class CudaAsyncPeer final : public Peer {
 public:
  CudaAsyncPeer() {
    cuda_check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  void* allocate(size_t bytes, Stream s) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, s);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: not sticky, the next call may succeed
      return nullptr;
    }
    cuda_check(e, "cudaMallocAsync");
    return p;
  }
  void deallocate(void* p, size_t, Stream s) override {
    cuda_check(cudaFreeAsync(p, s), "cudaFreeAsync");
  }
  void release_cached() override {
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_check(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
  }
  void reset_peak() override {
    uint64_t zero = 0;
    cuda_check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero),
               "cudaMemPoolSetAttribute(ReservedMemHigh)");
  }
  uint64_t peak_reserved() override {
    uint64_t v = 0;
    cuda_check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &v),
               "cudaMemPoolGetAttribute(ReservedMemHigh)");
    return v;
  }
  const char* peak_source() const override { return "cudaMemPoolAttrReservedMemHigh"; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace

std::unique_ptr<Peer> make_cuda_async_peer() { return std::make_unique<CudaAsyncPeer>(); }

}  // namespace expanse::peers
