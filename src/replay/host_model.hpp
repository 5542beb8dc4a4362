// How a replay issues a trace's operations, modelled on a PyTorch training process on a GPU: which
// host thread makes each allocation and free, on which stream handle, and how far the GPU runs
// behind the host. A memory snapshot records none of this (no thread, no GPU time), so the model
// takes explicit parameters, the same for every trace (docs/performance.md, "The host model").
#pragma once

#include "trace/trace.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace expanse::replay {

struct HostModel {
  // Ticks (trace operations) the GPU runs behind the host: work expanse puts on a stream at
  // operation i (a fence) completes once the replay has issued operation i + gpu_lag
  // (sim_gpu_lag). On a GPU the application's kernels queue ahead of every fence.
  uint64_t gpu_lag = 0;
  // The backward passes on a second thread (PyTorch's autograd engine runs a CUDA device's
  // backward on a thread of its own): the trace's own threads where it has them (a generated
  // workload), else autograd_threads(). Thread 0 is the main thread, any other the second.
  bool autograd_thread = false;
  // Thread caches as the library sets them (EXPANSE_CONF thread_cache), instead of off.
  bool thread_caches = false;
  // The trace's legacy default stream (id 0) passed as PyTorch passes it, NULL from every thread;
  // false: as CU_STREAM_LEGACY.
  bool null_stream = true;

  // "gpu_lag=N,threads=1|2,thread_caches=on|off" (the CLI's --host).
  std::string describe() const;
};

// What replays use unless told otherwise: PyTorch's native allocator path on a GPU running
// behind its host, calibrated once (docs/performance.md, "The host model").
HostModel default_host_model();
// The plain path: one thread, no thread caches, the GPU keeping up with the host.
HostModel plain_host_model();
// Parses describe()'s form over `base` ("torch" and "plain" name the two above); keys left out
// keep base's values. Throws usage_error naming the bad key or value.
HostModel parse_host_model(const std::string& text, HostModel base = default_host_model());

// Which thread makes each operation of t (0: the main thread, 1: the autograd thread). A trace
// does not say; a training step's backward pass shows as the fall of live bytes from the step's
// peak to its trough, and those operations are the autograd thread's, from just after the peak
// until live bytes first come within 1/16 of the fall of the trough. A peak (trough) counts once
// live bytes have fallen (risen) from it by a quarter of the swing before it and by at least
// 1/16 of the trace's peak live bytes, so that the small swings of inference and of a KV cache
// stay on the main thread.
std::vector<uint8_t> autograd_threads(const trace::Trace& t);

}  // namespace expanse::replay
