// Probe of the real driver's VMM error codes, run by hand on an H100 (driver 580.159.04,
// 2026-11-23); output beside it. Not built by CMake:
//   g++ -O1 -I/usr/local/cuda/include probe2.cpp -o probe2 -lcuda && ./probe2
#include "vmm_probe.hpp"

int main() {
  probe_start();
  int r;
  { CUdeviceptr p = res(4 * G); CUmemGenericAllocationHandle h = mk(2 * G);
    r = cuMemMap(p, G, 0, h, 0); P("1 map size G of 2G handle rc=%d\n", r); if (!r) cuMemUnmap(p, G);
    P("2 map size 0 off G rc=%d\n", cuMemMap(p, 0, G, h, 0));
    P("2b map size 0 unaligned ptr rc=%d\n", cuMemMap(p + 4096, 0, 0, h, 0));
    cuMemAddressFree(p, 4 * G);
    CUdeviceptr q = 0; r = cuMemAddressReserve(&q, 3 * G, 0, p, 0); P("3 hint rc=%d same=%d\n", r, q == p);
    r = cuMemMap(q + 2 * G, 2 * G, 0, h, 0); P("3 map overhang after hint rc=%d\n", r); if (!r) cuMemUnmap(q + 2 * G, 2 * G);
    r = cuMemMap(q + G, 2 * G, 0, h, 0); P("3 map inside rc=%d\n", r); if (!r) cuMemUnmap(q + G, 2 * G);
    r = cuMemUnmap(q + 2 * G, 2 * G); P("4 unmap unmapped overhang rc=%d\n", r);
    cuMemMap(q + G, 2 * G, 0, h, 0); r = cuMemUnmap(q + G, 4 * G); P("4 unmap mapping+overhang rc=%d retain=%d\n", r, mapped(q + G));
    r = cuMemUnmap(q + G - 4096, 2 * G + 8192); P("5 unmap unaligned covering whole rc=%d retain=%d\n", r, mapped(q + G));
    r = cuMemUnmap(q + 4096, 2 * G); P("5b unmap unaligned partial rc=%d retain=%d\n", r, mapped(q + G));
    r = cuMemUnmap(q + G, 2 * G - 4096); P("5c unmap unaligned size partial rc=%d retain=%d\n", r, mapped(q + G));
    cuMemUnmap(q + G, 2 * G); cuMemAddressFree(q, 3 * G); cuMemRelease(h);
  }
  { CUdeviceptr p = res(4 * G); CUmemGenericAllocationHandle a = mk(G), b = mk(G), c = mk(G);
    cuMemMap(p, G, 0, a, 0); cuMemMap(p + G, G, 0, b, 0); cuMemMap(p + 3 * G, G, 0, c, 0);
    r = sa(p, 4 * G); P("6 setaccess a,b,hole,c rc=%d access %lld %lld %lld %lld\n", r, ga(p), ga(p + G), ga(p + 2 * G), ga(p + 3 * G));
    cuMemUnmap(p, 4 * G); cuMemAddressFree(p, 4 * G);
    p = res(4 * G); cuMemMap(p, G, 0, a, 0); cuMemMap(p + 2 * G, G, 0, b, 0); cuMemMap(p + 3 * G, G, 0, c, 0);
    r = sa(p, 4 * G); P("6b setaccess a,hole,b,c rc=%d access %lld %lld %lld %lld\n", r, ga(p), ga(p + G), ga(p + 2 * G), ga(p + 3 * G));
    r = sa(p + 2 * G, 2 * G); P("6c setaccess b,c rc=%d access %lld %lld\n", r, ga(p + 2 * G), ga(p + 3 * G));
    r = sa(p, 4 * G, 1); P("6d setaccess hole dev1 rc=%d\n", r);
    cuMemUnmap(p, 4 * G); cuMemAddressFree(p, 4 * G); cuMemRelease(a); cuMemRelease(b); cuMemRelease(c);
  }
  { unsigned vals[] = {0x1, 0x101, 0x8, 0x4, 0x2, 0x9};
    for (unsigned v : vals) { CUmemGenericAllocationHandle h = 0; CUmemAllocationProp b = prop0(); b.requestedHandleTypes = (CUmemAllocationHandleType)v; r = cuMemCreate(&h, G, &b, 0);
      P("8 create handletypes 0x%x rc=%d", v, r);
      if (r == 0) { CUmemAllocationProp got{}; int r2 = cuMemGetAllocationPropertiesFromHandle(&got, h); P(" props rc=%d handletypes=0x%x", r2, (unsigned)got.requestedHandleTypes); cuMemRelease(h); }
      P("\n"); } }
  P("done1\n"); fflush(stdout);
  { CUdeviceptr p = res(2 * G), q = res(2 * G); P("9 adjacent=%d\n", q == p + 2 * G);
    CUmemGenericAllocationHandle h = mk(2 * G);
    r = cuMemMap(p + G, 2 * G, 0, h, 0); P("9 map spanning rc=%d\n", r);
    r = sa(p + G, 2 * G); P("9 setaccess spanning rc=%d access %lld %lld\n", r, ga(p + G), ga(p + 2 * G));
    r = cuMemAddressFree(p, 2 * G); P("9 free first while spanning rc=%d\n", r);
    r = cuMemUnmap(p + G, 2 * G); P("9 unmap spanning rc=%d\n", r);
    if (r == 0) { r = cuMemAddressFree(p, 2 * G); P("9 free first after rc=%d\n", r); }
    r = cuMemAddressFree(q, 2 * G); P("9 free second rc=%d\n", r);
  }
  P("done\n");
  return 0;
}
