// Thrust's CUDA backend on expanse memory, compiled by nvcc. Runs only where a GPU is present:
// without one it exits with 77, which ctest reports as skipped (SKIP_RETURN_CODE).
//
// What only nvcc can check: with the CUDA backend, the device system tag differs from the host's,
// so the static_asserts below catch an allocator whose pointer type would make Thrust run
// "device" algorithms on the host.
#include "expanse/memory_resource.hpp"
#include "expanse/thrust.hpp"

#include <thrust/functional.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <type_traits>

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
#error "this test is built by nvcc with the CUDA device system"
#endif

using vec_iter = expanse::device_vector<int>::iterator;
static_assert(std::is_same<thrust::iterator_system<vec_iter>::type, thrust::device_system_tag>::value,
              "expanse::device_vector iterators must be device iterators");
static_assert(!std::is_same<thrust::iterator_system<vec_iter>::type, thrust::host_system_tag>::value,
              "expanse::device_vector iterators must not be host iterators");
static_assert(std::is_same<thrust::device_system_tag, thrust::cuda::tag>::value, "CUDA backend");
static_assert(cuda::mr::async_resource_with<expanse::memory_resource, cuda::mr::device_accessible>,
              "expanse::memory_resource is a CCCL async resource");

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++g_failures;
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

  try {
    // ctest sets EXPANSE_CONF=driver:cuda: never the sim, whose host memory kernels cannot use.
    std::printf("expanse driver: %s\n", expanse::driver_description().c_str());
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    expanse::device_allocator dev(0);
    {
      const int n = 1 << 22;
      expanse::device_vector<int> v(n, 0, expanse::thrust_allocator<int>(0, stream));
      check(dev.stats().live_blocks == 1, "vector storage from expanse");
      thrust::sequence(expanse::thrust_exec_policy(stream), v.begin(), v.end());
      const auto before = dev.stats().num_allocs;
      thrust::sort(expanse::thrust_exec_policy(stream), v.begin(), v.end(), thrust::greater<int>());
      check(dev.stats().num_allocs > before, "sort took temporary storage from expanse");
      check(dev.stats().live_blocks == 1, "temporary storage given back");
      check(v[0] == n - 1 && v[n - 1] == 0, "sorted descending");
      const long long sum = thrust::reduce(expanse::thrust_exec_policy(stream), v.begin(), v.end(),
                                           0LL);
      check(sum == static_cast<long long>(n) * (n - 1) / 2, "reduce");
      v.resize(n / 4);
      v.shrink_to_fit();
      check(dev.stats().requested_bytes == sizeof(int) * (n / 4), "shrink_to_fit gives memory back");
    }
    cudaStreamSynchronize(stream);
    check(dev.stats().live_blocks == 0, "everything freed");
    dev.release_cached();  // expanse is done with the stream before it goes away
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::printf("FAIL  exception: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", g_failures == 0 ? "PASS" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
