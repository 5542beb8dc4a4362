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
  // Announces a capture in ctx (on `stream`, remembered for end_stream). Waits while a sync of
  // ctx runs: a capture begun during it would be invalidated.
  static void begin(CUcontext ctx, const void* stream = nullptr);
  // Ends one announcement in ctx; an end without a begin changes nothing.
  static void end(CUcontext ctx);
  // Ends the announcement begun on `stream` (with no driver call: the stream may be gone by
  // now). False if none was begun on it.
  static bool end_stream(const void* stream);
  // How many captures are announced in ctx now.
  static int count(CUcontext ctx);
  // Runs op() (a context sync, or a record on the legacy stream, which waits for every blocking
  // stream) and returns its result, unless a capture is announced in ctx: then returns false
  // without calling it. Announcements in ctx wait meanwhile, so none begins during op(); nothing
  // else waits (no lock is held across op()). An exception from op() counts as false.
  static bool run_unless_capturing(CUcontext ctx, const std::function<bool()>& op);
};

}  // namespace expanse::core
