// A CUDA graph whose temporaries come from expanse, in a pool of its own.
//
// A graph's kernels read and write the same addresses on every replay. Memory the graph
// allocated and freed during capture must therefore never be handed to anything else while the
// graph can still be replayed: an expanse::pool is that private reuse domain. capture_scope
// routes every allocation made on the capture's streams to the pool (call it before
// cudaStreamBeginCapture: it also tells expanse a capture is coming, so expanse never
// synchronizes the context under it). Eager work meanwhile allocates from the default pool and
// never gets the graph's bytes. When the graph is gone, releasing the pool gives its memory back.
//
//   EXPANSE_CONF=driver:cuda build/bin/example_cuda_graph_pool
//
// Exits 77 (skipped) where no GPU is.
#include "expanse/expanse.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace {

__global__ void fill(float* x, float v, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) x[i] = v + static_cast<float>(i % 7);
}

__global__ void axpy(float* out, const float* x, const float* y, float a, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] += a * x[i] + y[i];
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  constexpr size_t n = size_t{1} << 22;  // 16 MiB of floats per temporary
  constexpr size_t bytes = n * sizeof(float);
  constexpr int replays = 20;
  const unsigned grid = static_cast<unsigned>((n + 255) / 256);

  cudaStream_t s = nullptr, eager = nullptr;
  if (!check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
      !check(cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking), "stream")) {
    return 1;
  }
  // The graph's output lives across replays: allocated before the capture, in the default pool.
  auto* out = static_cast<float*>(expanse::allocate(bytes, 0, s));
  if (!check(cudaMemsetAsync(out, 0, bytes, s), "memset")) return 1;

  cudaGraphExec_t exec = nullptr;
  std::vector<std::pair<void*, size_t>> graph_memory;  // what the graph's kernels address
  {
    expanse::pool graph_pool(0);
    {
      expanse::capture_scope routing(graph_pool, s);
      if (!check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture")) return 1;
      // Temporaries allocated and freed inside the capture: the pool reuses them within the
      // graph (y may take x's bytes), and nobody outside it ever does.
      auto* x = static_cast<float*>(expanse::allocate(bytes, 0, s));
      fill<<<grid, 256, 0, s>>>(x, 1.0f, n);
      auto* y = static_cast<float*>(expanse::allocate(bytes, 0, s));
      fill<<<grid, 256, 0, s>>>(y, 2.0f, n);
      axpy<<<grid, 256, 0, s>>>(out, x, y, 0.5f, n);
      graph_memory = {{x, bytes}, {y, bytes}};
      expanse::deallocate(x, 0, s);
      expanse::deallocate(y, 0, s);
      cudaGraph_t graph = nullptr;
      if (!check(cudaStreamEndCapture(s, &graph), "end capture") ||
          !check(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
        return 1;
      }
      cudaGraphDestroy(graph);
    }  // routing ends

    const expanse_pool_stats st = graph_pool.stats();
    std::printf("graph pool %llu: %llu bytes cached for the graph, %llu physical\n",
                static_cast<unsigned long long>(st.id),
                static_cast<unsigned long long>(st.cached_bytes),
                static_cast<unsigned long long>(st.physical_bytes));

    // Replays, with eager work allocating beside them on another stream.
    for (int r = 0; r < replays; ++r) {
      if (!check(cudaGraphLaunch(exec, s), "launch")) return 1;
      auto* tmp = static_cast<float*>(expanse::allocate(bytes, 0, eager));
      for (const auto& [p, nb] : graph_memory) {
        if (overlaps(tmp, bytes, p, nb)) {
          std::fprintf(stderr, "eager block %p overlaps the graph's memory at %p\n",
                       static_cast<void*>(tmp), p);
          return 1;
        }
      }
      fill<<<grid, 256, 0, eager>>>(tmp, -100.0f, n);
      expanse::deallocate(tmp, 0, eager);
    }
    if (!check(cudaStreamSynchronize(s), "sync") || !check(cudaStreamSynchronize(eager), "sync")) {
      return 1;
    }
    std::vector<float> host(n);
    if (!check(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost), "copy")) return 1;
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(replays) *
                         (0.5f * (1.0f + static_cast<float>(i % 7)) + 2.0f + static_cast<float>(i % 7));
      if (host[i] != want) {
        std::fprintf(stderr, "out[%zu] = %g, expected %g\n", i, host[i], want);
        return 1;
      }
    }
    std::printf("%d replays beside eager allocations: output correct, no eager block in the "
                "graph's memory\n", replays);
    cudaGraphExecDestroy(exec);
  }  // the graph is gone: releasing its pool lets its memory serve others

  expanse::device_allocator(0).release_cached();  // proves the replays done, returns the pages
  expanse::deallocate(out, 0, s);
  cudaStreamDestroy(s);
  cudaStreamDestroy(eager);
  std::printf("pool released; device physical bytes now %llu\n",
              static_cast<unsigned long long>(expanse::device_allocator(0).stats().physical_bytes));
  return 0;
}
