// Thrust with expanse: device_vector storage and the algorithms' temporary storage come from
// expanse, ordered on one stream.
//
// Builds both ways from this one file:
//   CUDA backend, on a GPU:
//     nvcc -std=c++17 -x cu sort_with_expanse.cpp -lexpanse
//   CPU backend (Thrust's CPP device system), on the sim:
//     g++ -std=c++17 -I<CUDA>/include/cccl -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP
//         sort_with_expanse.cpp -lexpanse
// and runs with EXPANSE_CONF=driver:sim (CPU backend) or on a GPU (CUDA backend).
#include <expanse/thrust.hpp>

#include <thrust/copy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <cstdio>
#include <vector>

#if defined(__CUDACC__)
#define EXAMPLE_HD __host__ __device__
#else
#define EXAMPLE_HD
#endif

struct scramble {
  // A bijection on [0, 2^20): multiply by an odd number modulo 2^20.
  EXAMPLE_HD unsigned operator()(unsigned x) const { return (x * 2654435761u) & 0xFFFFFu; }
};

int main() {
  try {
    // On a GPU, pass a cudaStream_t here; nullptr is the legacy default stream.
    expanse::stream_t stream = nullptr;
    const int device = 0;
    const unsigned n = 1u << 20;

    // Storage from expanse on (device, stream).
    expanse::device_vector<unsigned> keys(n, 0u, expanse::thrust_allocator<unsigned>(device, stream));
    thrust::sequence(expanse::thrust_exec_policy(stream, device), keys.begin(), keys.end());
    thrust::transform(expanse::thrust_exec_policy(stream, device), keys.begin(), keys.end(),
                      keys.begin(), scramble{});

    // Temporary storage from expanse too: thrust::cuda::par(allocator).on(stream) on CUDA.
    const auto before = expanse::device_allocator(device).stats().num_allocs;
    thrust::sort(expanse::thrust_exec_policy(stream, device), keys.begin(), keys.end());
    const auto temp_allocs = expanse::device_allocator(device).stats().num_allocs - before;

    const unsigned long long sum = thrust::reduce(expanse::thrust_exec_policy(stream, device),
                                                  keys.begin(), keys.end(), 0ULL);
    std::vector<unsigned> head(4);
    thrust::copy(keys.begin(), keys.begin() + 4, head.begin());

    keys.resize(1000);
    keys.shrink_to_fit();  // gives the rest back to expanse

    const expanse::Stats s = expanse::device_allocator(device).stats();
    std::printf("driver: %s\n", expanse::driver_description().c_str());
    std::printf("sorted %u keys: %u %u %u %u ... sum %llu\n", n, head[0], head[1], head[2], head[3],
                sum);
    std::printf("temporary allocations from expanse during the sort: %llu\n",
                static_cast<unsigned long long>(temp_allocs));
    std::printf("after shrink_to_fit: %llu live block(s), %llu bytes requested\n",
                static_cast<unsigned long long>(s.live_blocks),
                static_cast<unsigned long long>(s.requested_bytes));
    const bool ok = head[0] == 0 && head[3] == 3 &&
                    sum == static_cast<unsigned long long>(n) * (n - 1) / 2 && temp_allocs > 0;
    std::printf("%s\n", ok ? "ok" : "WRONG RESULT");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
