// What probe1.cpp and probe2.cpp share: device 0's primary context made current, its VMM
// granularity G, and terse wrappers that print a failure instead of stopping.
#pragma once
#include <cuda.h>
#include <cstdio>
#include <cstdint>
static size_t G;
static CUmemAllocationProp prop0() {
  CUmemAllocationProp p{}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0; return p;
}
static CUmemGenericAllocationHandle mk(size_t n) {
  CUmemGenericAllocationHandle h = 0; CUmemAllocationProp p = prop0();
  CUresult r = cuMemCreate(&h, n, &p, 0); if (r) printf("create fail %d\n", r); return h;
}
static CUdeviceptr res(size_t n) { CUdeviceptr p = 0; CUresult r = cuMemAddressReserve(&p, n, 0, 0, 0); if (r) printf("reserve fail %d\n", r); return p; }
static int sa(CUdeviceptr p, size_t n, int dev = 0) {
  CUmemAccessDesc d{}; d.location.type = CU_MEM_LOCATION_TYPE_DEVICE; d.location.id = dev; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(p, n, &d, 1);
}
static long long ga(CUdeviceptr p) { CUmemLocation l{}; l.type = CU_MEM_LOCATION_TYPE_DEVICE; l.id = 0; unsigned long long f = 99; CUresult r = cuMemGetAccess(&f, &l, p); if (r) return -(long long)r; return (long long)f; }
static int mapped(CUdeviceptr p) { CUmemGenericAllocationHandle h = 0; CUresult r = cuMemRetainAllocationHandle(&h, (void*)p); if (r == 0) cuMemRelease(h); return r; }
#define P(...) printf(__VA_ARGS__)

static void probe_start() {
  cuInit(0); CUdevice dev; cuDeviceGet(&dev, 0); CUcontext ctx; cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  CUmemAllocationProp pr = prop0(); cuMemGetAllocationGranularity(&G, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}
