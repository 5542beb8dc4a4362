// Probe of the real driver's VMM error codes, run by hand on an H100 (driver 580.159.04,
// 2026-11-23); output beside it. Not built by CMake:
//   g++ -O1 -I/usr/local/cuda/include probe1.cpp -o probe1 -lcuda && ./probe1
#include "vmm_probe.hpp"
int main() {
  probe_start();
  P("G=%zu\n", G);
  // A granularity
  { size_t g = 77; CUmemAllocationProp b = prop0(); b.type = CU_MEM_ALLOCATION_TYPE_INVALID; int r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran type INVALID rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.type = (CUmemAllocationType)0x7; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran type 7 rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.location.type = CU_MEM_LOCATION_TYPE_INVALID; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran loc INVALID rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran loc HOST_NUMA rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.location.id = 1; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran dev 1 rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.location.id = -1; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran dev -1 rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.location.id = 1000; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran dev 1000 rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED); P("A gran recommended rc=%d g=%zu\n", r, g);
    g = 77; b = prop0(); b.requestedHandleTypes = (CUmemAllocationHandleType)0x100; r = cuMemGetAllocationGranularity(&g, &b, CU_MEM_ALLOC_GRANULARITY_MINIMUM); P("A gran handletype 0x100 rc=%d g=%zu\n", r, g);
  }
  // B create bad handle types
  { unsigned vals[] = {0x100, 0x10, 0x20, 0x40, 0x80, 0x3, 0x80000000u};
    for (unsigned v : vals) { CUmemGenericAllocationHandle h = 0; CUmemAllocationProp b = prop0(); b.requestedHandleTypes = (CUmemAllocationHandleType)v; int r = cuMemCreate(&h, G, &b, 0);
      P("B create handletypes 0x%x rc=%d", v, r);
      if (r == 0) { CUmemAllocationProp got{}; int r2 = cuMemGetAllocationPropertiesFromHandle(&got, h); P(" props rc=%d handletypes=0x%x", r2, (unsigned)got.requestedHandleTypes); cuMemRelease(h); }
      P("\n"); }
    CUmemGenericAllocationHandle h = 0; CUmemAllocationProp b = prop0(); b.type = CU_MEM_ALLOCATION_TYPE_INVALID; P("B create type INVALID rc=%d\n", cuMemCreate(&h, G, &b, 0));
    b = prop0(); b.location.type = CU_MEM_LOCATION_TYPE_INVALID; P("B create loc INVALID rc=%d\n", cuMemCreate(&h, G, &b, 0));
  }
  // C geometry
  { CUdeviceptr p = res(3 * G), q = res(3 * G); P("C p=%llx q=%llx q-p=%llu G\n", (unsigned long long)p, (unsigned long long)q, (unsigned long long)((q - p) / G));
    CUmemGenericAllocationHandle h = mk(G);
    for (int k = -4; k < 40; ++k) { int r = cuMemMap(p + (long long)k * G, G, 0, h, 0); P("C map p%+d*G rc=%d\n", k, r); if (r == 0) cuMemUnmap(p + (long long)k * G, G); }
    CUmemGenericAllocationHandle h2 = mk(2 * G);
    int r = cuMemMap(p + 2 * G, 2 * G, 0, h2, 0); P("C map p+2G size 2G rc=%d\n", r); if (!r) cuMemUnmap(p + 2 * G, 2 * G);
    r = cuMemMap(p + G, 2 * G, 0, h2, 0); P("C map p+G size 2G rc=%d\n", r); if (!r) cuMemUnmap(p + G, 2 * G);
    CUdeviceptr s = res(G); r = cuMemMap(s + G, G, 0, h, 0); P("C 1G reserve s=%llx map s+G rc=%d\n", (unsigned long long)s, r); if (!r) cuMemUnmap(s + G, G);
    CUdeviceptr big = res(64 * G); P("C big=%llx\n", (unsigned long long)big);
    for (int k = 62; k < 70; ++k) { r = cuMemMap(big + (long long)k * G, G, 0, h, 0); P("C big map +%d*G rc=%d\n", k, r); if (!r) cuMemUnmap(big + (long long)k * G, G); }
    CUdeviceptr al = 0; r = cuMemAddressReserve(&al, 3 * G, 16 * G, 0, 0); P("C aligned16 reserve rc=%d al=%llx\n", r, (unsigned long long)al);
    for (int k = 2; k < 20; ++k) { r = cuMemMap(al + (long long)k * G, G, 0, h, 0); P("C al map +%d*G rc=%d\n", k, r); if (!r) cuMemUnmap(al + (long long)k * G, G); }
    CUdeviceptr g2 = res(2 * G); cuMemAddressFree(g2, 2 * G); r = cuMemMap(g2, G, 0, h, 0); P("C map freed rc=%d\n", r); if (!r) cuMemUnmap(g2, G);
    r = cuMemUnmap(g2, G); P("C unmap freed VA rc=%d\n", r);
    r = cuMemUnmap(0x1000000, G); P("C unmap random low VA rc=%d\n", r);
  }
  // D unmap over hole, each case fresh
  const char* names[] = {"(p,3G)", "(p+G,G) hole only", "(p,2G) map+hole", "(p+G,2G) hole+map"};
  size_t offs[] = {0, 1, 0, 1}, lens[] = {3, 1, 2, 2};
  for (int c = 0; c < 4; ++c) {
    CUdeviceptr p = res(3 * G); CUmemGenericAllocationHandle a = mk(G), b = mk(G);
    cuMemMap(p, G, 0, a, 0); cuMemMap(p + 2 * G, G, 0, b, 0); sa(p, G); sa(p + 2 * G, G);
    int r = cuMemUnmap(p + offs[c] * G, lens[c] * G);
    P("D unmap %s rc=%d; retain(p)=%d retain(p+2G)=%d access p=%lld p+2G=%lld\n", names[c], r, mapped(p), mapped(p + 2 * G), ga(p), ga(p + 2 * G));
    int r1 = cuMemMap(p, G, 0, a, 0), r2 = cuMemMap(p + 2 * G, G, 0, b, 0); P("   remap a rc=%d b rc=%d\n", r1, r2);
    cuMemUnmap(p, 3 * G); cuMemRelease(a); cuMemRelease(b); cuMemAddressFree(p, 3 * G);
  }
  { // D2: mapping 2G + hole; unmap(p+G, 2G) sub-range+hole; unmap(p, 3G) whole+hole
    CUdeviceptr p = res(3 * G); CUmemGenericAllocationHandle a = mk(2 * G); cuMemMap(p, 2 * G, 0, a, 0);
    int r = cuMemUnmap(p + G, 2 * G); P("D2 unmap half-mapping+hole rc=%d retain(p)=%d\n", r, mapped(p));
    r = cuMemUnmap(p, G); P("D2 unmap half-mapping rc=%d retain(p)=%d\n", r, mapped(p));
    r = cuMemUnmap(p, 3 * G); P("D2 unmap whole+hole rc=%d retain(p)=%d\n", r, mapped(p));
    r = cuMemUnmap(p, 0); P("D2 unmap size0 rc=%d\n", r);
    r = cuMemUnmap(p + 4096, G); P("D2 unmap unaligned rc=%d\n", r);
    cuMemRelease(a); cuMemAddressFree(p, 3 * G);
  }
  { // D3 hole first then partial mapping: hole G, mapping 2G at p+G; unmap(p, 2G)
    CUdeviceptr p = res(3 * G); CUmemGenericAllocationHandle a = mk(2 * G); cuMemMap(p + G, 2 * G, 0, a, 0);
    int r = cuMemUnmap(p, 2 * G); P("D3 unmap hole+half-mapping rc=%d retain(p+G)=%d\n", r, mapped(p + G));
    cuMemUnmap(p + G, 2 * G); cuMemRelease(a); cuMemAddressFree(p, 3 * G);
  }
  // E set access over hole, each case fresh
  for (int c = 0; c < 4; ++c) {
    CUdeviceptr p = res(3 * G); CUmemGenericAllocationHandle a = mk(G), b = mk(G);
    cuMemMap(p, G, 0, a, 0); cuMemMap(p + 2 * G, G, 0, b, 0);
    int r = sa(p + offs[c] * G, lens[c] * G);
    P("E setaccess %s rc=%d; access p=%lld p+G=%lld p+2G=%lld\n", names[c], r, ga(p), ga(p + G), ga(p + 2 * G));
    cuMemUnmap(p, G); cuMemUnmap(p + 2 * G, G); cuMemRelease(a); cuMemRelease(b); cuMemAddressFree(p, 3 * G);
  }
  { CUdeviceptr e = res(G); int r = sa(e, G); P("E setaccess empty reservation rc=%d access=%lld\n", r, ga(e));
    CUdeviceptr p = res(3 * G); CUmemGenericAllocationHandle a = mk(2 * G); cuMemMap(p, 2 * G, 0, a, 0);
    r = sa(p + G, 2 * G); P("E setaccess half-mapping+hole rc=%d access p=%lld p+G=%lld\n", r, ga(p), ga(p + G));
    r = sa(p + G, G); P("E setaccess half-mapping rc=%d access p=%lld p+G=%lld\n", r, ga(p), ga(p + G));
    r = sa(p, G, 1); P("E setaccess dev 1 rc=%d\n", r); r = sa(p, G, -1); P("E setaccess dev -1 rc=%d\n", r);
    CUmemAccessDesc d{}; d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; d.location.id = 0; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemSetAccess(p, 2 * G, &d, 1); P("E setaccess host numa rc=%d\n", r);
    d.location.type = CU_MEM_LOCATION_TYPE_HOST; r = cuMemSetAccess(p, 2 * G, &d, 1); P("E setaccess HOST rc=%d\n", r);
    d.location.type = CU_MEM_LOCATION_TYPE_INVALID; r = cuMemSetAccess(p, 2 * G, &d, 1); P("E setaccess loc INVALID rc=%d\n", r);
    d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT; r = cuMemSetAccess(p, 2 * G, &d, 1); P("E setaccess HOST_NUMA_CURRENT rc=%d\n", r);
    r = sa(p + 4096, G); P("E setaccess unaligned rc=%d\n", r);
    CUdeviceptr g2 = res(2 * G); cuMemAddressFree(g2, 2 * G); r = sa(g2, G); P("E setaccess freed VA rc=%d\n", r);
  }
  // F map misuse order
  { CUdeviceptr p = res(4 * G); CUmemGenericAllocationHandle h = mk(2 * G);
    P("F map off G rc=%d\n", cuMemMap(p, G, G, h, 0)); 
    P("F map off 4096 rc=%d\n", cuMemMap(p, G, 4096, h, 0));
    P("F map size G/2 rc=%d\n", cuMemMap(p, G / 2, 0, h, 0));
    P("F map size 3G/2 rc=%d\n", cuMemMap(p, 3 * G / 2, 0, h, 0));
    P("F map size 3G rc=%d\n", cuMemMap(p, 3 * G, 0, h, 0));
    P("F map size 0 rc=%d\n", cuMemMap(p, 0, 0, h, 0));
    P("F map ptr+4096 rc=%d\n", cuMemMap(p + 4096, 2 * G, 0, h, 0));
    P("F map ptr+4096 off G rc=%d\n", cuMemMap(p + 4096, G, G, h, 0));
    P("F map flags 1 off G rc=%d\n", cuMemMap(p, G, G, h, 1));
    P("F map handle 0 off G rc=%d\n", cuMemMap(p, G, G, 0, 0));
    CUdeviceptr g2 = res(2 * G); cuMemAddressFree(g2, 2 * G);
    P("F map freed off G rc=%d\n", cuMemMap(g2, G, G, h, 0));
    P("F map freed size 3G rc=%d\n", cuMemMap(g2, 3 * G, 0, h, 0));
    P("F map size 3G unaligned ptr rc=%d\n", cuMemMap(p + 4096, 3 * G, 0, h, 0));
    P("F map off G size G/2 rc=%d\n", cuMemMap(p, G / 2, G, h, 0));
    P("F map ok rc=%d\n", cuMemMap(p, 2 * G, 0, h, 0));
    CUmemGenericAllocationHandle h2 = mk(2 * G);
    P("F map over mapping off G rc=%d\n", cuMemMap(p, G, G, h2, 0));
    P("F map over mapping size 3G rc=%d\n", cuMemMap(p, 3 * G, 0, h2, 0));
  }
  P("done\n");
  return 0;
}
