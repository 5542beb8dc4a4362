// Pinned host memory: bytes pinned per byte asked, and the time per request, for expanse's host
// pool (HOST_NUMA pages: core/host/host_pool.hpp), beside a model of PyTorch's CachingHostAllocator
// (every request rounded up to a power of two; and with pinned_max_round_threshold_mb, above which
// a request is exact) and plain cuMemHostAlloc (exact to the host page), from one run.
//
//   build/bin/expanse_bench_pinned_host                    (the sim; 1 MiB .. 32 GiB)
//   EXPANSE_BENCH_CONF=driver:cuda build/bin/expanse_bench_pinned_host   (a GPU with host VMM)
//
// Time columns: "modeled" prices each request's driver calls with the cost table (the H100 one
// on the sim: cuMemCreate, cuMemMap and cuMemSetAccess per page for expanse; one cuMemHostAlloc
// of the pinned bytes for the others); "timed" is this machine's wall time for expanse's request
// (on the sim: the sim's bookkeeping, not pinning). On a GPU the timed column is the figure.
#include "bench_driver.hpp"
#include "core/host/host_pool.hpp"
#include "driver_api/cost_model.hpp"
#include "models/torch_host_allocator.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using expanse::driver::EntryPoint;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

}  // namespace

int main() {
  auto drv = expanse::bench::open_bench_driver(80 * GiB, /*sim_backing=*/true, "pinned host bench");
  const expanse::driver::DriverTable& t = drv->table();
  if (t.init(0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuInit failed\n");
    return 1;
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  t.device_get(&dev, 0);
  if (t.device_primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS) {
    std::fprintf(stderr, "no primary context\n");
    return 1;
  }
  int vmm = 0;
  t.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (vmm == 0) {
    std::fprintf(stderr, "this driver has no host NUMA VMM (attribute 141 is 0)\n");
    return 1;
  }
  const expanse::driver::CostModel& m = expanse::driver::CostModel::get_default();
  const size_t threshold = 64 * MiB;  // pinned_max_round_threshold_mb:64
  std::printf("%s; PyTorch model threshold %zu MiB\n", drv->description().c_str(), threshold / MiB);
  std::printf("pinned bytes per byte asked (x) and time per request; modeled ms price expanse's "
              "HOST_NUMA calls with the table's device cuMemCreate/cuMemMap/cuMemSetAccess costs "
              "(host pinning per byte is not in the table yet: measure on a GPU)\n");
  std::printf("%12s | %10s %12s %10s | %10s %10s | %12s %12s\n", "asked MiB", "expanse x",
              "modeled ms", "timed ms", "pow2 x", "thresh x", "cuMemHostAlloc x", "modeled ms");
  const std::vector<size_t> sizes = {1 * MiB,   3 * MiB,   17 * MiB,          100 * MiB,
                                     1 * GiB,   5 * GiB + 1, size_t(20.4 * GiB), 32 * GiB};
  for (size_t asked : sizes) {
    expanse::core::HostPool pool(t, 0, ctx, 0, 1, SIZE_MAX, 2 * asked + GiB);
    const auto t0 = std::chrono::steady_clock::now();
    void* p = pool.allocate(asked, nullptr, 0);
    const double timed_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const expanse::core::HostPoolStats s = pool.stats();
    const auto pages = static_cast<double>(s.pinned_bytes / s.page_bytes);
    const auto per = [&](size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(asked); };
    const double modeled_ms =
        pages * (m.cost_ns(EntryPoint::mem_create, s.page_bytes) +
                 m.cost_ns(EntryPoint::mem_map, s.page_bytes) +
                 m.cost_ns(EntryPoint::mem_set_access, s.page_bytes)) / 1e6;
    const size_t exact = (asked + 4095) / 4096 * 4096;
    const double host_alloc_ms = m.cost_ns(EntryPoint::mem_host_alloc, exact) / 1e6;
    std::printf("%12.1f | %10.3f %12.2f %10.2f | %10.3f %10.3f | %12.3f %12.2f\n",
                static_cast<double>(asked) / static_cast<double>(MiB), per(s.pinned_bytes),
                modeled_ms, timed_ms, per(expanse::models::torch_host_block_bytes(asked)),
                per(expanse::models::torch_host_block_bytes(asked, threshold)),
                per(exact), host_alloc_ms);
    pool.free(p, nullptr);
  }
  t.device_primary_ctx_release(dev);
  return 0;
}
