// Invariant 3 on a real GPU: no block is handed to other work, or unmapped, while a kernel may
// still write it. Compiled by nvcc; runs only where a GPU is (without one it exits 77: skipped).
//
// Each case launches a kernel that waits (~kDelayMs) and then fills block A with pattern P1, frees
// A while that kernel runs, and has other work take memory at once and fill it with P2. After a
// full device synchronize every byte handed out later must still hold P2: an allocator that
// reused or remapped A's pages too early shows P1 in it (or faults, for an unmap). Which way
// the allocator stayed safe (waited, or handed out other memory) is printed, not asserted.
//
// Cases: another stream; record_stream from a second stream; a destroyed stream whose handle
// value may come back; per-thread default streams of two threads; the legacy stream; reclaim
// under a limit (pages remapped); release_cached (pages unmapped); a CUDA graph capture with
// allocations inside it while another thread makes the allocator call the VMM API.
//
//   EXPANSE_CONF=driver:cuda build/bin/expanse_gpu_stream_safety_test
#include "expanse/expanse.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr uint32_t kP1 = 0x11111111u;  // the late writer's pattern
constexpr uint32_t kP2 = 0x22222222u;  // the new owner's pattern
constexpr size_t kBytes = size_t{64} << 20;
constexpr int kDelayMs = 150;

int g_failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what);
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("FAIL  %s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  ++g_failures;
  return false;
}

// Spins on the global timer for delay_ns, then fills n words with v (grid-stride).
__global__ void delayed_fill(uint32_t* p, size_t n, uint32_t v, unsigned long long delay_ns) {
  unsigned long long start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= delay_ns) break;
    __nanosleep(1000);
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

__global__ void count_not(const uint32_t* p, size_t n, uint32_t v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (p[i] != v) ++mine;
  }
  if (mine != 0) atomicAdd(bad, mine);
}

void late_write(void* p, size_t bytes, cudaStream_t s) {
  // One small block: the kernel occupies one SM while it waits, so the new owner's kernel runs
  // beside it and the late write really comes after it.
  delayed_fill<<<4, 256, 0, s>>>(static_cast<uint32_t*>(p), bytes / 4, kP1,
                                 static_cast<unsigned long long>(kDelayMs) * 1000000ull);
}

void fill_now(void* p, size_t bytes, cudaStream_t s) {
  delayed_fill<<<264, 256, 0, s>>>(static_cast<uint32_t*>(p), bytes / 4, kP2, 0);
}

// After everything is done: how many words of [p, p+bytes) are not P2.
unsigned long long words_not_p2(void* p, size_t bytes) {
  unsigned long long* bad = nullptr;
  if (!cuda_ok(cudaDeviceSynchronize(), "device synchronize before the check")) return ~0ull;
  if (!cuda_ok(cudaMalloc(&bad, sizeof(*bad)), "cudaMalloc (checker)")) return ~0ull;
  cudaMemset(bad, 0, sizeof(*bad));
  count_not<<<264, 256>>>(static_cast<const uint32_t*>(p), bytes / 4, kP2, bad);
  unsigned long long host = ~0ull;
  cuda_ok(cudaMemcpy(&host, bad, sizeof(host), cudaMemcpyDeviceToHost), "checker copy");
  cudaFree(bad);
  return host;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Taken {
  void* p = nullptr;
  double alloc_ms = 0;
};

Taken take(size_t bytes, cudaStream_t s) {
  const auto t0 = std::chrono::steady_clock::now();
  Taken t;
  t.p = expanse_malloc(bytes, 0, s);
  t.alloc_ms = ms_since(t0);
  if (t.p == nullptr) std::printf("      expanse_malloc failed: %s\n", expanse_last_error());
  return t;
}

void report(const char* name, void* old_p, const Taken& t) {
  const unsigned long long bad = words_not_p2(t.p, kBytes);
  std::printf("      %s: %s pointer, allocate took %.1f ms, %llu words overwritten late\n", name,
              t.p == old_p ? "same" : "other", t.alloc_ms, bad);
  check(bad == 0, name);
}

void case_other_stream() {
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  void* a = expanse_malloc(kBytes, 0, s1);
  late_write(a, kBytes, s1);
  expanse_free(a, kBytes, 0, s1);
  const Taken b = take(kBytes, s2);
  if (b.p != nullptr) {
    fill_now(b.p, kBytes, s2);
    report("freed on s1 under a running kernel, taken on s2", a, b);
    expanse_free(b.p, kBytes, 0, s2);
  } else {
    check(false, "allocate on s2");
  }
  cudaDeviceSynchronize();
  expanse_release_cached(0);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

void case_record_stream() {
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  void* a = expanse_malloc(kBytes, 0, s1);
  late_write(a, kBytes, s2);  // another stream uses the block...
  check(expanse_record_stream(a, s2) == EXPANSE_OK, "record_stream");
  expanse_free(a, kBytes, 0, s1);  // ...and it is freed on its own stream, which is idle
  const Taken b = take(kBytes, s1);
  if (b.p != nullptr) {
    fill_now(b.p, kBytes, s1);
    report("used on s2 (record_stream), freed and taken again on s1", a, b);
    expanse_free(b.p, kBytes, 0, s1);
  } else {
    check(false, "allocate on s1");
  }
  cudaDeviceSynchronize();
  expanse_release_cached(0);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

void case_destroyed_stream() {
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  void* a = expanse_malloc(kBytes, 0, s1);
  late_write(a, kBytes, s1);
  expanse_free(a, kBytes, 0, s1);
  const cudaStream_t old = s1;
  cudaStreamDestroy(s1);  // returns at once; the kernel runs on
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  std::printf("      the new stream's handle is %s the destroyed one's\n",
              s2 == old ? "THE SAME AS" : "different from");
  const Taken b = take(kBytes, s2);
  if (b.p != nullptr) {
    fill_now(b.p, kBytes, s2);
    report("freed on a stream destroyed under a running kernel, taken on a new stream", a, b);
    expanse_free(b.p, kBytes, 0, s2);
  } else {
    check(false, "allocate on the new stream");
  }
  cudaDeviceSynchronize();
  expanse_release_cached(0);
  cudaStreamDestroy(s2);
}

void case_per_thread_streams() {
  std::atomic<int> stage{0};
  void* a = nullptr;
  std::thread t1([&] {
    a = expanse_malloc(kBytes, 0, cudaStreamPerThread);
    late_write(a, kBytes, cudaStreamPerThread);
    expanse_free(a, kBytes, 0, cudaStreamPerThread);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    cudaStreamSynchronize(cudaStreamPerThread);
  });
  Taken b;
  std::thread t2([&] {
    while (stage.load() != 1) std::this_thread::yield();
    b = take(kBytes, cudaStreamPerThread);
    if (b.p != nullptr) fill_now(b.p, kBytes, cudaStreamPerThread);
    stage = 2;
  });
  t1.join();
  t2.join();
  if (b.p != nullptr) {
    report("freed on thread 1's per-thread stream, taken on thread 2's", a, b);
    expanse_free(b.p, kBytes, 0, nullptr);
  } else {
    check(false, "allocate on thread 2's per-thread stream");
  }
  cudaDeviceSynchronize();
  expanse_release_cached(0);
}

void case_legacy_stream() {
  cudaStream_t nb;
  cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);  // not ordered after the legacy stream
  void* a = expanse_malloc(kBytes, 0, nullptr);
  late_write(a, kBytes, nullptr);
  expanse_free(a, kBytes, 0, nullptr);
  const Taken b = take(kBytes, nb);
  if (b.p != nullptr) {
    fill_now(b.p, kBytes, nb);
    report("freed on the legacy stream, taken on a non-blocking stream", a, b);
    expanse_free(b.p, kBytes, 0, nb);
  } else {
    check(false, "allocate on the non-blocking stream");
  }
  cudaDeviceSynchronize();
  expanse_release_cached(0);
  cudaStreamDestroy(nb);
}

void case_reclaim_under_limit() {
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  expanse_release_cached(0);
  expanse_stats st{};
  st.struct_size = sizeof(st);
  expanse_get_stats(0, &st);
  // Room for A, the guard and one more block: B (1.5 blocks) needs half of A's pages remapped.
  check(expanse_set_limit(0, st.physical_bytes + 3 * kBytes) == EXPANSE_OK, "set_limit");
  void* a = expanse_malloc(kBytes, 0, s1);
  void* guard = expanse_malloc(kBytes, 0, s1);  // keeps A's pages from growing in place
  late_write(a, kBytes, s1);
  expanse_free(a, kBytes, 0, s1);
  const auto t0 = std::chrono::steady_clock::now();
  void* b = expanse_malloc(kBytes + kBytes / 2, 0, s2);
  const double ms = ms_since(t0);
  if (b != nullptr) {
    const size_t n = kBytes + kBytes / 2;
    delayed_fill<<<264, 256, 0, s2>>>(static_cast<uint32_t*>(b), n / 4, kP2, 0);
    const unsigned long long bad = words_not_p2(b, n);
    std::printf("      allocate (needs A's pages) took %.1f ms, %llu words overwritten late\n", ms,
                bad);
    check(bad == 0, "pages of a block freed under a running kernel, remapped under a limit");
    expanse_free(b, n, 0, s2);
  } else {
    std::printf("      expanse_malloc failed: %s\n", expanse_last_error());
    check(false, "allocate under the limit");
  }
  expanse_free(guard, kBytes, 0, s1);
  cudaDeviceSynchronize();
  expanse_set_limit(0, SIZE_MAX);
  expanse_release_cached(0);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

void case_release_cached_under_kernel() {
  cudaStream_t s1;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  void* a = expanse_malloc(kBytes, 0, s1);
  late_write(a, kBytes, s1);
  expanse_free(a, kBytes, 0, s1);
  const auto t0 = std::chrono::steady_clock::now();
  check(expanse_release_cached(0) == EXPANSE_OK, "release_cached");
  std::printf("      release_cached took %.1f ms (the kernel waits %d ms)\n", ms_since(t0),
              kDelayMs);
  // An unmap under the kernel is an illegal-address fault, reported here (and sticky).
  check(cuda_ok(cudaStreamSynchronize(s1), "the kernel on a block whose pages were released"),
        "release_cached waited for the kernel before unmapping");
  cudaStreamDestroy(s1);
}

__global__ void add_one(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] += 1;
  }
}

// Allocations inside a global-mode capture, while another thread makes the allocator create and
// map pages (cuMemCreate/cuMemMap/cuMemSetAccess), free them and release_cached (which would
// synchronize the context): the capture, announced with expanse_capture_begin/end, must stay
// valid and the graph must run. (Unannounced, the other thread's context sync invalidated it on
// an H100, driver 580: no driver query shows a capture another thread is about to begin.)
void case_capture() {
  cudaStream_t cs;
  cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  void* out = expanse_malloc(kBytes, 0, cs);
  cudaMemsetAsync(out, 0, kBytes, cs);
  cudaStreamSynchronize(cs);

  std::atomic<bool> stop{false};
  std::atomic<int> other_ok{0}, other_fail{0};
  std::thread other([&] {
    cudaStream_t os;
    cudaStreamCreateWithFlags(&os, cudaStreamNonBlocking);
    size_t n = size_t{2} << 20;
    while (!stop.load()) {
      void* p = expanse_malloc(n, 0, os);
      if (p != nullptr) {
        ++other_ok;
        expanse_free(p, n, 0, os);
      } else {
        ++other_fail;
      }
      expanse_release_cached(0);  // the next one creates and maps again
      n = n % (size_t{64} << 20) + (size_t{2} << 20);
    }
    cudaStreamSynchronize(os);
    cudaStreamDestroy(os);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));

  cudaGraph_t graph = nullptr;
  check(expanse_capture_begin(cs) == EXPANSE_OK, "capture announced");
  bool began = cuda_ok(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), "begin capture");
  if (began) {
    for (int i = 0; i < 8; ++i) {
      const size_t n = (size_t{1} << 20) * static_cast<size_t>(i + 1);
      void* tmp = expanse_malloc(n, 0, cs);  // during capture
      if (tmp == nullptr) {
        std::printf("      malloc during capture failed: %s\n", expanse_last_error());
        check(false, "allocate during capture");
        break;
      }
      add_one<<<64, 256, 0, cs>>>(static_cast<uint32_t*>(out), kBytes / 4);
      expanse_free(tmp, n, 0, cs);  // during capture
    }
    const cudaError_t end = cudaStreamEndCapture(cs, &graph);
    check(cuda_ok(end, "end capture"), "capture stays valid with allocations inside it");
  }
  check(expanse_capture_end(cs) == EXPANSE_OK, "capture announcement ended");
  stop = true;
  other.join();
  std::printf("      the other thread: %d allocations, %d failures\n", other_ok.load(),
              other_fail.load());
  check(other_fail.load() == 0, "allocations beside a global-mode capture all succeed");
  if (graph != nullptr) {
    cudaGraphExec_t exec = nullptr;
    if (cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
      cuda_ok(cudaGraphLaunch(exec, cs), "graph launch");
      cuda_ok(cudaStreamSynchronize(cs), "graph run");
      std::vector<uint32_t> host(16);
      cudaMemcpy(host.data(), out, host.size() * 4, cudaMemcpyDeviceToHost);
      check(host[0] == 8 && host[15] == 8, "the graph ran its 8 kernels on expanse memory");
      cudaGraphExecDestroy(exec);
    }
    cudaGraphDestroy(graph);
  }
  expanse_free(out, kBytes, 0, cs);
  cudaDeviceSynchronize();
  expanse_release_cached(0);
  cudaStreamDestroy(cs);
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA GPU (cudaGetDeviceCount: %s, %d devices)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "no error", devices);
    return 77;
  }
  cudaSetDevice(0);
  cudaFree(nullptr);  // the primary context, current on this thread
  std::printf("expanse driver: %s\n", expanse_driver_description());
  std::printf("-- another stream\n");
  case_other_stream();
  std::printf("-- record_stream\n");
  case_record_stream();
  std::printf("-- destroyed stream\n");
  case_destroyed_stream();
  std::printf("-- per-thread default streams\n");
  case_per_thread_streams();
  std::printf("-- legacy stream\n");
  case_legacy_stream();
  std::printf("-- reclaim under a limit\n");
  case_reclaim_under_limit();
  std::printf("-- capture\n");
  case_capture();
  std::printf("-- release_cached under a running kernel (last: a fault is sticky)\n");
  case_release_cached_under_kernel();
  expanse_stats st{};
  st.struct_size = sizeof(st);
  expanse_get_stats(0, &st);
  std::printf("driver calls %llu, modeled driver seconds %.4f\n",
              static_cast<unsigned long long>(st.driver_calls_total), st.modeled_driver_seconds);
  std::printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
