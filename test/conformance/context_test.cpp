// Rules for contexts and cuMemGetInfo.
#include "conformance.hpp"

namespace expanse::conformance {
namespace {

// cuMemGetInfo_v2 needs a current context.
TEST_P(Conformance, MemGetInfoWithoutContextIsInvalidContext) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  CUcontext cur = reinterpret_cast<CUcontext>(0x1);
  ASSERT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  ASSERT_EQ(cur, nullptr);
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().mem_get_info(&free_bytes, &total));
  // With one, it works.
  make_current();
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free_bytes, &total));
  EXPECT_GT(total, 0u);
  EXPECT_LE(free_bytes, total);
  if (hooks() != nullptr) {
    EXPECT_EQ(total, kSimCapacity);
    EXPECT_EQ(free_bytes, kSimCapacity);
  }
}

// cuMemGetInfo(&free, NULL) is accepted.
TEST_P(Conformance, MemGetInfoAcceptsNullTotal) {
  make_current();
  size_t free_bytes = 0;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));
  EXPECT_GT(free_bytes, 0u);
}

// Releasing a primary context that was never retained is INVALID_CONTEXT; a bad
// device is INVALID_DEVICE.
TEST_P(Conformance, PrimaryCtxReleaseWithoutRetainIsInvalidContext) {
  const CUdevice d0 = dev(0);  // the fixture retains it only in make_current(), not called here
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().device_primary_ctx_release(d0));
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_release(device_count()));
  // Retain/release pairs balance: one retain allows exactly one release.
  CUcontext ctx = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&ctx, d0));
  EXPECT_NE(ctx, nullptr);
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(d0));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().device_primary_ctx_release(d0));
}

// cuDevicePrimaryCtxRetain does not make the context current; retaining again returns the
// same context; bad device is INVALID_DEVICE.
TEST_P(Conformance, PrimaryCtxRetainDoesNotMakeCurrent) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  CUcontext a = nullptr;
  CUcontext b = nullptr;
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&a, dev(0)));
  ASSERT_CU(CUDA_SUCCESS, t().device_primary_ctx_retain(&b, dev(0)));
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(a, b);
  CUcontext cur = reinterpret_cast<CUcontext>(0x1);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, nullptr);
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(0)));
  EXPECT_CU(CUDA_SUCCESS, t().device_primary_ctx_release(dev(0)));
  CUcontext c = nullptr;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, t().device_primary_ctx_retain(&c, device_count()));
}

// cuCtxPushCurrent / cuCtxPopCurrent: a per-thread stack; popping an empty stack is
// INVALID_CONTEXT.
TEST_P(Conformance, CtxStackPushPop) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  const CUcontext ctx = make_current();
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));

  ASSERT_CU(CUDA_SUCCESS, t().ctx_push_current(ctx));
  CUcontext cur = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, ctx);
  // While pushed, context-needing calls work.
  size_t free_bytes = 0;
  EXPECT_CU(CUDA_SUCCESS, t().mem_get_info(&free_bytes, nullptr));

  CUcontext popped = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().ctx_pop_current(&popped));
  EXPECT_EQ(popped, ctx);
  cur = reinterpret_cast<CUcontext>(0x1);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, nullptr);
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().ctx_pop_current(&popped));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().mem_get_info(&free_bytes, nullptr));

  // Push twice, pop twice: LIFO.
  ASSERT_CU(CUDA_SUCCESS, t().ctx_push_current(ctx));
  ASSERT_CU(CUDA_SUCCESS, t().ctx_push_current(ctx));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_pop_current(&popped));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, ctx);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_pop_current(&popped));
  EXPECT_EQ(popped, ctx);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, nullptr);
}

// cuCtxSetCurrent(NULL) unbinds and succeeds; cuCtxSetCurrent replaces the top of the stack.
TEST_P(Conformance, CtxSetCurrentNullUnbinds) {
  const CUcontext ctx = make_current();
  CUcontext cur = nullptr;
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, ctx);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  EXPECT_CU(CUDA_SUCCESS, t().ctx_get_current(&cur));
  EXPECT_EQ(cur, nullptr);
  EXPECT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));  // no-op when nothing is current
}

// cuCtxSynchronize needs a context; with one it succeeds.
TEST_P(Conformance, CtxSynchronizeNeedsContext) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT, t().ctx_synchronize());
  make_current();
  EXPECT_CU(CUDA_SUCCESS, t().ctx_synchronize());
}

// VMM calls need no current context (they name the device in CUmemLocation).
TEST_P(Conformance, VmmCallsWorkWithoutContext) {
  ASSERT_CU(CUDA_SUCCESS, t().ctx_set_current(nullptr));
  const Block b = make_block(1);
  EXPECT_EQ(get_access(b.ptr), static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_CU(CUDA_SUCCESS, unmap(b.ptr, b.size));
  EXPECT_CU(CUDA_SUCCESS, release(b.handle));
  EXPECT_CU(CUDA_SUCCESS, address_free(b.ptr, b.size));
}

}  // namespace
}  // namespace expanse::conformance
