// expanse as a CCCL memory resource: code written against cuda::mr takes expanse memory
// without knowing about expanse.
//
//   g++ -std=c++17 -I<CUDA>/include -I<CUDA>/include/cccl memory_resource_example.cpp -lexpanse
//   EXPANSE_CONF=driver:sim ./a.out          (or on a GPU, with driver:auto)
#include <expanse/memory_resource.hpp>  // first: it enables cuda::mr on CCCL 3.0

#include <cstdio>

#if CCCL_VERSION < 3001000
// CCCL 3.0 (CUDA 13.0): async_resource_ref is the stream-ordered, type-erased reference.
using device_mr_ref = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;

void* allocate_on(device_mr_ref mr, cudaStream_t stream, size_t bytes) {
  return mr.allocate_async(bytes, 256, cuda::stream_ref(stream));
}
void deallocate_on(device_mr_ref mr, cudaStream_t stream, void* p, size_t bytes) {
  mr.deallocate_async(p, bytes, 256, cuda::stream_ref(stream));
}
#else
// CCCL 3.1+: resource_ref is the stream-ordered reference; allocate takes the stream first.
using device_mr_ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;

void* allocate_on(device_mr_ref mr, cudaStream_t stream, size_t bytes) {
  return mr.allocate(cuda::stream_ref(stream), bytes, 256);
}
void deallocate_on(device_mr_ref mr, cudaStream_t stream, void* p, size_t bytes) {
  mr.deallocate(cuda::stream_ref(stream), p, bytes, 256);
}
#endif

// A library function that only knows cuda::mr: a scratch buffer per call.
size_t scratch_roundtrip(device_mr_ref mr, cudaStream_t stream) {
  size_t total = 0;
  for (size_t bytes : {size_t{1} << 10, size_t{1} << 20, size_t{48} << 20}) {
    void* p = allocate_on(mr, stream, bytes);
    total += bytes;
    deallocate_on(mr, stream, p, bytes);
  }
  return total;
}

int main() {
  try {
    expanse::memory_resource resource(/*device=*/0);
    const size_t bytes = scratch_roundtrip(resource, /*stream=*/cudaStream_t{});
    const expanse::Stats s = expanse::device_allocator(0).stats();
    std::printf("driver: %s\n", expanse::driver_description().c_str());
    std::printf("cuda::mr user allocated %zu bytes in %llu allocations from expanse; live now: %llu\n",
                bytes, static_cast<unsigned long long>(s.num_allocs),
                static_cast<unsigned long long>(s.live_blocks));
    const bool ok = s.num_allocs == 3 && s.live_blocks == 0;
    std::printf("%s\n", ok ? "ok" : "WRONG RESULT");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
