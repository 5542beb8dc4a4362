// Copies between a pool's blocks and their host staging, gathered into runs: blocks adjacent in
// VA whose staging is adjacent too go in one copy, so a pool of many small tensors (a model's
// biases and norms between its matrices) costs a few large copies, not one per tensor.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace expanse::core {

template <class Issue>  // void(CUdeviceptr addr, size_t staging_offset, size_t bytes)
class CopyRuns {
 public:
  explicit CopyRuns(Issue issue) : issue_(issue) {}
  // Adds [addr, addr + bytes) <-> staging [off, off + bytes); issues the run before it when the
  // two are not adjacent on both sides.
  void add(CUdeviceptr addr, size_t off, size_t bytes) {
    if (bytes_ != 0 && addr == addr_ + bytes_ && off == off_ + bytes_) {
      bytes_ += bytes;
      return;
    }
    flush();
    addr_ = addr;
    off_ = off;
    bytes_ = bytes;
  }
  // Issues the run gathered so far.
  void flush() {
    if (bytes_ != 0) issue_(addr_, off_, bytes_);
    bytes_ = 0;
  }

 private:
  Issue issue_;
  CUdeviceptr addr_ = 0;
  size_t off_ = 0;
  size_t bytes_ = 0;
};

}  // namespace expanse::core
