// Graph captures the application announces, per context, so that expanse never synchronizes a
// context while one of its streams captures.
//
// Synchronizing a context while any of its streams captures invalidates that capture, whatever
// the capture modes and whichever thread synchronizes (CUDA Programming Guide, "Prohibited and
// Unhandled Operations"; measured on NVIDIA GPUs: ROCm/rocm-systems#4508, NVIDIA/TensorRT#2888,
// ggml-org/llama.cpp#14033). The driver has no query for "does any stream of this context
// capture", and a capture another thread begins between expanse's check of the streams it knows
// and its cuCtxSynchronize cannot be seen: only the application knows it is about to capture.
// PyTorch solves it the same way: CUDAGraph::capture_begin tells its allocator
// (beginAllocateToPool, under the allocator's lock) before cudaStreamBeginCapture, and the
// allocator never runs its synchronizing path while a capture is under way (captures_underway).
//
// begin() before cuStreamBeginCapture, end() after cuStreamEndCapture; process-wide (every
// device's allocator may synchronize any context it has streams of).
#pragma once

#include <cuda.h>

#include <functional>

namespace expanse::core {

class CaptureAnnouncements {
 public:
  static void begin(CUcontext ctx);
  static void end(CUcontext ctx);
  // How many captures are announced in ctx now.
  static int count(CUcontext ctx);
  // Runs op() (a context sync, or a record on the legacy stream, which waits for every blocking
  // stream) and returns its result, unless a capture is announced in ctx: then returns false
  // without calling it. Announcements wait meanwhile, so none begins during op().
  static bool run_unless_capturing(CUcontext ctx, const std::function<bool()>& op);
};

}  // namespace expanse::core
