// Rules for pinned host memory (cuMemHostAlloc, cuMemFreeHost) and the stream-ordered copies
// (cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemsetD8Async). cuda.h documents the codes
// (SUCCESS, NOT_INITIALIZED, INVALID_CONTEXT, INVALID_VALUE, OUT_OF_MEMORY for the allocation,
// INVALID_HANDLE for the copies) but not which misuse gives which; rules the documentation does
// not settle are sim-only (see sim_vmm.cpp), as are those whose misuse may fault a real device
// (an unmapped range: sticky ILLEGAL_ADDRESS) or crash a real driver (a garbage stream handle).
#include "conformance.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace expanse::conformance {
namespace {

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

// Pinned host memory is usable at once, page-aligned, and a round trip through device memory on
// a stream (HtoD, memset of part, DtoH) gives back what was written once the stream is
// synchronized.
TEST_P(Conformance, PinnedRoundTripThroughAsyncCopiesAndMemset) {
  make_current();
  const Block b = make_block(1);
  const size_t n = gran();
  auto* in = static_cast<unsigned char*>(host_alloc(n, CU_MEMHOSTALLOC_PORTABLE));
  auto* out = static_cast<unsigned char*>(host_alloc(n));
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(in) % 4096, 0u);
  const std::vector<unsigned char> data = pattern(n, 3);
  std::memcpy(in, data.data(), n);
  std::memset(out, 0, n);
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod_async(b.ptr, in, n, s));
  ASSERT_CU(CUDA_SUCCESS, t().memset_d8_async(b.ptr + 100, 0xAB, 50, s));
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(out, b.ptr, n, s));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
  std::vector<unsigned char> expect = data;
  std::memset(expect.data() + 100, 0xAB, 50);
  EXPECT_EQ(std::memcmp(out, expect.data(), n), 0);
  EXPECT_CU(CUDA_SUCCESS, free_host(in));
  EXPECT_CU(CUDA_SUCCESS, free_host(out));
  if (hooks() != nullptr) {
    EXPECT_EQ(hooks()->outstanding().host_allocations, 0u);
    EXPECT_EQ(hooks()->async_faults(), 0u);
  }
}

// Pageable host memory (not from cuMemHostAlloc) is allowed both ways, on a created stream and
// on the legacy (NULL) stream; the data is there after a synchronize.
TEST_P(Conformance, PageableAsyncCopiesWork) {
  make_current();
  const Block b = make_block(1);
  const std::vector<unsigned char> data = pattern(8192, 5);
  std::vector<unsigned char> out(data.size(), 0);
  const CUstream s = make_stream();
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod_async(b.ptr + 7, data.data(), data.size(), s));
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(out.data(), b.ptr + 7, out.size(), s));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
  EXPECT_EQ(out, data);
  std::vector<unsigned char> out2(data.size(), 0);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(out2.data(), b.ptr + 7, out2.size(), nullptr));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(nullptr));
  EXPECT_EQ(out2, data);
}

// Without a current context: INVALID_CONTEXT for the allocation and the copies.
TEST_P(Conformance, HostAllocAndAsyncCopiesWithoutContextAreInvalidContext) {
  make_current();
  const Block b = make_block(1);
  void* pinned = host_alloc(4096);
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  void* p = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, try_host_alloc(&p, 4096));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().memcpy_htod_async(b.ptr, pinned, 64, nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().memcpy_dtoh_async(pinned, b.ptr, 64, nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().memset_d8_async(b.ptr, 0, 64, nullptr));
  if (hooks() != nullptr) {  // the sim asks for a context to free too (strict)
    EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().mem_free_host(pinned));
  }
  make_current();
  EXPECT_CU(CUDA_SUCCESS, free_host(pinned));
}

// cuMemFreeHost of memory cuMemHostAlloc did not return is INVALID_VALUE; on the sim also NULL,
// an interior pointer and a second free.
TEST_P(Conformance, FreeHostOfOtherMemoryIsInvalidValue) {
  make_current();
  void* heap = std::malloc(4096);
  ASSERT_NE(heap, nullptr);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_free_host(heap));
  std::free(heap);
  if (hooks() == nullptr) return;
  auto* p = static_cast<unsigned char*>(host_alloc(8192));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_free_host(nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_free_host(p + 16));
  EXPECT_CU(CUDA_SUCCESS, free_host(p));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_free_host(p));
}

// A NULL result pointer is INVALID_VALUE. bytesize 0 and unknown flags: INVALID_VALUE on the
// sim (strict; cuda.h is silent); a real driver's answer is recorded, not judged.
TEST_P(Conformance, HostAllocBadArgumentsAreInvalidValue) {
  make_current();
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().mem_host_alloc(nullptr, 4096, 0));
  void* p = nullptr;
  const CUresult zero = try_host_alloc(&p, 0);
  const CUresult flags = try_host_alloc(&p, 4096, 0x80);
  if (hooks() != nullptr) {
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, zero);
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, flags);
  } else {
    RecordProperty("cuMemHostAlloc_bytesize_0", result_name(zero));
    RecordProperty("cuMemHostAlloc_flags_0x80", result_name(flags));
  }
}

// Zero bytes is a successful no-op for all three; a NULL host pointer with bytes is
// INVALID_VALUE (sim: as the synchronous copies).
TEST_P(Conformance, AsyncZeroBytesIsSuccess) {
  make_current();
  const Block b = make_block(1);
  unsigned char buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const CUstream s = make_stream();
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod_async(b.ptr, buf, 0, s));
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(buf, b.ptr, 0, s));
  EXPECT_CU(CUDA_SUCCESS, t().memset_d8_async(b.ptr, 0, 0, s));
  EXPECT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
  if (hooks() != nullptr) {
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod_async(b.ptr, nullptr, 8, s));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh_async(nullptr, b.ptr, 8, s));
  }
}

// Misuse the real driver may answer by faulting or crashing, sim-only: an unmapped or
// read-only device range is INVALID_VALUE (as the synchronous copies), a handle that names no
// stream INVALID_HANDLE, a stream of another context INVALID_HANDLE; nothing is copied.
TEST_P(Conformance, AsyncCopyMisuseCodes) {
  CONFORMANCE_REQUIRE_SIM("an unmapped range faults a real device; a bad handle may crash it");
  make_current();
  const CUdeviceptr p = reserve(2 * gran());
  map(p, gran(), create(gran()));
  ASSERT_CU(CUDA_SUCCESS, set_access(p, gran()));
  auto* h = static_cast<unsigned char*>(host_alloc(4096));
  std::memset(h, 0x5A, 4096);
  const CUstream s = make_stream();
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod_async(p + gran() - 8, h, 16, s));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_dtoh_async(h, p + gran(), 16, s));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memset_d8_async(p + gran() - 1, 0, 2, s));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memset_d8_async(p, 0, SIZE_MAX, s));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(h[i], 0x5A) << "a failed copy wrote to host memory";
  // Read-only: DtoH works, HtoD and memset do not.
  ASSERT_CU(CUDA_SUCCESS, set_access(p, gran(), 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memcpy_htod_async(p, h, 16, s));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, t().memset_d8_async(p, 0, 16, s));
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(h, p, 16, s));
  const auto bogus = reinterpret_cast<CUstream>(uintptr_t{0x1000});
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().memcpy_htod_async(p, h, 16, bogus));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().memcpy_dtoh_async(h, p, 16, bogus));
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().memset_d8_async(p, 0, 16, bogus));
  // A stream of device 1's context, used from device 0's.
  CUcontext c1 = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&c1, dev(1)));
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(c1));
  CUstream other = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_create(&other, 0));
  make_current();
  EXPECT_CU(CUDA_ERROR_INVALID_HANDLE, t().memcpy_dtoh_async(h, p, 16, other));
  ASSERT_CU(CUDA_SUCCESS, t().stream_destroy(other));
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(1)));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(s));
}

// A pinned copy or memset on a capturing stream is captured, not executed: device memory is
// unchanged after the capture ends, and the capture ends with a graph.
TEST_P(Conformance, AsyncCopyOnCapturingStreamIsCapturedNotExecuted) {
  make_current();
  const Block b = make_block(1);
  auto* h = static_cast<unsigned char*>(host_alloc(4096));
  std::memset(h, 0x11, 4096);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_htod(b.ptr, h, 4096));
  std::memset(h, 0x77, 4096);
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_htod_async(b.ptr, h, 4096, s));
  EXPECT_CU(CUDA_SUCCESS, t().memset_d8_async(b.ptr, 0x22, 64, s));
  if (hooks() != nullptr) {
    // Pageable memory on a capturing stream: refused, and the capture is invalidated (sim, strict).
    std::vector<unsigned char> pageable(64, 0);
    EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
              t().memcpy_dtoh_async(pageable.data(), b.ptr, pageable.size(), s));
    CUgraph g = nullptr;
    EXPECT_CU(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, t().stream_end_capture(s, &g));
  } else {
    CUgraph g = nullptr;
    ASSERT_CU(CUDA_SUCCESS, t().stream_end_capture(s, &g));
    ASSERT_NE(g, nullptr);
    EXPECT_CU(CUDA_SUCCESS, t().graph_destroy(g));
  }
  std::vector<unsigned char> out(4096, 0);
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh(out.data(), b.ptr, out.size()));
  for (unsigned char c : out) ASSERT_EQ(c, 0x11) << "a captured copy ran";
}

// On the sim, a pinned capture ends valid with a graph, and the copy never ran.
TEST_P(Conformance, PinnedAsyncCopyCaptureEndsWithAGraph) {
  CONFORMANCE_REQUIRE_SIM("the cuda variant checks this within the rule above");
  make_current();
  const Block b = make_block(1);
  auto* h = static_cast<unsigned char*>(host_alloc(64));
  std::memset(h, 0x33, 64);
  const CUstream s = make_stream(CU_STREAM_NON_BLOCKING);
  ASSERT_CU(CUDA_SUCCESS, t().stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(h, b.ptr, 64, s));
  CUgraph g = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().stream_end_capture(s, &g));
  EXPECT_CU(CUDA_SUCCESS, t().graph_destroy(g));
  for (int i = 0; i < 64; ++i) ASSERT_EQ(h[i], 0x33) << "a captured copy ran";
}

// The five entry points are counted, and an injected failure returns its code doing nothing.
TEST_P(Conformance, HostAndAsyncEntryPointsAreCountedAndInjectable) {
  CONFORMANCE_REQUIRE_SIM("needs the sim's call counters and failure injection");
  make_current();
  const Block b = make_block(1);
  const char* names[] = {"cuMemHostAlloc", "cuMemFreeHost", "cuMemcpyHtoDAsync",
                         "cuMemcpyDtoHAsync", "cuMemsetD8Async"};
  unsigned long long before[5];
  for (int i = 0; i < 5; ++i) before[i] = hooks()->call_count(names[i]);
  hooks()->inject_failure("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY);
  void* p = nullptr;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_host_alloc(&p, 4096));
  EXPECT_EQ(hooks()->outstanding().host_allocations, 0u);
  auto* h = static_cast<unsigned char*>(host_alloc(4096));
  std::memset(h, 0x44, 4096);
  ASSERT_CU(CUDA_SUCCESS, t().memset_d8_async(b.ptr, 0, 4096, nullptr));
  hooks()->inject_failure("cuMemcpyHtoDAsync", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_CU(CUDA_ERROR_LAUNCH_FAILED, t().memcpy_htod_async(b.ptr, h, 4096, nullptr));
  hooks()->inject_failure("cuMemsetD8Async", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_CU(CUDA_ERROR_LAUNCH_FAILED, t().memset_d8_async(b.ptr, 9, 4096, nullptr));
  hooks()->inject_failure("cuMemcpyDtoHAsync", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_CU(CUDA_ERROR_LAUNCH_FAILED, t().memcpy_dtoh_async(h, b.ptr, 4096, nullptr));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(nullptr));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(h[i], 0x44) << "an injected DtoH copied";
  ASSERT_CU(CUDA_SUCCESS, t().memcpy_dtoh_async(h, b.ptr, 4096, nullptr));
  ASSERT_CU(CUDA_SUCCESS, t().stream_synchronize(nullptr));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(h[i], 0) << "an injected HtoD or memset ran";
  hooks()->inject_failure("cuMemFreeHost", 1, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().mem_free_host(h));
  EXPECT_CU(CUDA_SUCCESS, free_host(h));
  const unsigned long long want[5] = {2, 2, 1, 2, 2};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(hooks()->call_count(names[i]), before[i] + want[i]) << names[i];
}

// sim_host_capacity bounds pinned memory in all: beyond it OUT_OF_MEMORY; freeing gives it back.
TEST_P(Conformance, SimHostCapacityBoundsPinnedMemory) {
  CONFORMANCE_REQUIRE_SIM("a configured host capacity");
  ASSERT_NO_FATAL_FAILURE(reconfigure("sim_host_capacity:1MiB"));
  make_current();
  void* a = host_alloc(768 << 10);
  void* b = nullptr;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, try_host_alloc(&b, 512 << 10));
  void* c = host_alloc(256 << 10);
  EXPECT_EQ(hooks()->outstanding().host_bytes, 1u << 20);
  EXPECT_CU(CUDA_SUCCESS, free_host(a));
  b = host_alloc(512 << 10);
  EXPECT_CU(CUDA_SUCCESS, free_host(b));
  EXPECT_CU(CUDA_SUCCESS, free_host(c));
}

// Before cuInit all five are NOT_INITIALIZED.
TEST_P(Conformance, HostAndAsyncBeforeInitAreNotInitialized) {
  CONFORMANCE_REQUIRE_SIM("needs a driver on which cuInit has not been called");
  ASSERT_NO_FATAL_FAILURE(reset_uninitialized());
  unsigned char buf[8] = {};
  void* p = nullptr;
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().mem_host_alloc(&p, 8, 0));
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().mem_free_host(buf));
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().memcpy_htod_async(0, buf, 8, nullptr));
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().memcpy_dtoh_async(buf, 0, 8, nullptr));
  EXPECT_CU(CUDA_ERROR_NOT_INITIALIZED, t().memset_d8_async(0, 0, 8, nullptr));
}

}  // namespace
}  // namespace expanse::conformance
