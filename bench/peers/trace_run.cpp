#include "peers/trace_run.hpp"

#include <chrono>

namespace expanse::peers {

TraceRunResult run_trace(Peer& peer, Gpu& gpu, const trace::Trace& t, int passes) {
  using Clock = std::chrono::steady_clock;
  // The legacy default stream where the recording used it (id 0), a stream of its own for each
  // other recorded stream.
  std::vector<Stream> streams = gpu.streams(t.streams.size());
  for (size_t i = 0; i < t.streams.size(); ++i) {
    if (t.streams[i] == 0) streams[i] = nullptr;
  }
  std::vector<void*> ptr(t.blocks, nullptr);
  std::vector<uint64_t> size(t.blocks, 0);
  std::vector<uint32_t> stream_of(t.blocks, 0);

  TraceRunResult r;
  gpu.bind_thread();
  gpu.synchronize();
  peer.reset_peak();
  for (int pass = 0; pass < passes; ++pass) {
    size_t next_release = 0;
    uint64_t released = 0;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < t.ops.size(); ++i) {
      for (; next_release < t.releases.size() && t.releases[next_release].op <= i;
           ++next_release) {
        if (t.releases[next_release].kind == trace::TraceRelease::Kind::empty_cache) {
          peer.release_cached();
          ++released;
        }
      }
      const trace::TraceOp& op = t.ops[i];
      if (op.type == trace::TraceOp::Type::alloc) {
        if (op.size == 0) continue;  // no block (allocate(0) is nullptr everywhere)
        void* p = peer.allocate(op.size, streams[op.stream]);
        if (p == nullptr) {
          ++r.ooms;
          continue;
        }
        gpu.touch(p, op.size, streams[op.stream]);
        ptr[op.block] = p;
        size[op.block] = op.size;
        stream_of[op.block] = op.stream;
      } else if (ptr[op.block] != nullptr) {
        // Freed on the stream it was allocated on, as PyTorch's free_completed is: its touch
        // ran there, so the stream order makes the reuse safe for every allocator.
        peer.deallocate(ptr[op.block], size[op.block], streams[stream_of[op.block]]);
        ptr[op.block] = nullptr;
      }
    }
    gpu.synchronize();
    r.pass_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    r.empty_cache_calls = released;
    // Blocks the recording leaves live are freed between passes, outside the timing.
    for (uint32_t b = 0; b < t.blocks; ++b) {
      if (ptr[b] != nullptr) {
        peer.deallocate(ptr[b], size[b], streams[stream_of[b]]);
        ptr[b] = nullptr;
      }
    }
    gpu.synchronize();
  }
  r.peak_reserved = peer.peak_reserved();
  return r;
}

}  // namespace expanse::peers
