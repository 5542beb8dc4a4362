#include "peers/gpu.hpp"

#include "peers/cuda_check.hpp"

#include <cuda_runtime_api.h>

namespace expanse::peers {

constexpr size_t kTouchStride = 4096;

Gpu::~Gpu() {
  for (Stream s : made_) (void)cudaStreamDestroy(s);
}

void Gpu::bind_thread() const {
  if (real_) cuda_check(cudaSetDevice(0), "cudaSetDevice");
}

std::vector<Stream> Gpu::streams(size_t n) {
  if (!real_) return std::vector<Stream>(n, nullptr);
  bind_thread();
  while (made_.size() < n) {
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    made_.push_back(s);
  }
  return std::vector<Stream>(made_.begin(), made_.begin() + static_cast<long>(n));
}

void Gpu::touch(void* p, size_t bytes, Stream s) const {
  if (!real_ || bytes == 0) return;
  const size_t rows = (bytes + kTouchStride - 1) / kTouchStride;
  cuda_check(cudaMemset2DAsync(p, kTouchStride, 1, 1, rows, s), "cudaMemset2DAsync");
}

void Gpu::synchronize() const {
  if (real_) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace expanse::peers
