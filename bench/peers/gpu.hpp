// What the workloads need from the GPU besides the allocator: streams, a touch of every page of
// a block, synchronization. On expanse's sim (no GPU) every stream is the legacy default stream
// and nothing is touched: the sim's pages are not the GPU's, and only the expanse columns run.
#pragma once

#include "peers/peer.hpp"

#include <cstddef>
#include <vector>

namespace expanse::peers {

class Gpu {
 public:
  explicit Gpu(bool real) : real_(real) {}
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  bool real() const { return real_; }
  // Makes device 0 current on the calling thread (each worker thread calls it first).
  void bind_thread() const;
  // n streams that do not synchronize with the legacy default stream, created once and kept.
  std::vector<Stream> streams(size_t n);
  // Writes one byte in every 4 KiB of [p, p + bytes) on s: the pages must be mapped and
  // writable, as for a tensor's first kernel. A strided cudaMemset2DAsync, so the program needs
  // the CUDA runtime and no device code.
  void touch(void* p, size_t bytes, Stream s) const;
  void synchronize() const;

 private:
  bool real_;
  std::vector<Stream> made_;
};

}  // namespace expanse::peers
