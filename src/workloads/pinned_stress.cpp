#include "workloads/pinned_stress.hpp"

#include "conf/env_config.hpp"
#include "core/base/format.hpp"
#include "core/host/host_pool.hpp"
#include "driver/driver.hpp"
#include "expanse/errors.hpp"
#include "models/torch_host_allocator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

namespace expanse::replay {
namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

// Offload-sized blocks: KV pages and activations (1-64 MiB), some small staging buffers.
size_t block_size(std::mt19937_64& rng, size_t capacity) {
  const size_t cap = std::max<size_t>(capacity / 64, MiB);
  switch (rng() % 4) {
    case 0: return 4096 + rng() % (256 * 1024);
    case 1: return MiB + rng() % (8 * MiB);
    default: return MiB + rng() % cap;
  }
}

}  // namespace

PinnedStressResult run_pinned_stress(const PinnedStressOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  PinnedStressResult r;
  r.seed = o.seed;
  const std::string& conf = o.conf;
  r.capacity = o.capacity != 0 ? o.capacity : 2 * GiB;
  std::unique_ptr<driver::LoadedDriver> drv;
  try {
    // On the sim: host memory behind pages, and the host capacity the run says.
    std::string text;
    for (const auto& [k, v] : conf::parse_pairs(conf)) {
      if (k != "sim_backing" && k != "sim_host_capacity") text += k + ":" + v + ",";
    }
    text += "sim_backing:true,sim_host_capacity:" + std::to_string(r.capacity);
    drv = driver::select_driver(text, true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(e.what(), static_cast<int>(e.code()));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  r.driver = drv->description();
  r.sim = drv->kind() == driver::DriverKind::sim;
  const driver::DriverTable& t = drv->table();
  if (t.init(0) != CUDA_SUCCESS) throw driver_failure("stress --pinned: cuInit failed", 0);
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (t.device_get(&dev, 0) != CUDA_SUCCESS || t.device_primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS) {
    throw driver_failure("stress --pinned: no primary context on device 0", 0);
  }
  struct Release {
    const driver::DriverTable& t;
    CUdevice dev;
    ~Release() { t.device_primary_ctx_release(dev); }
  } release{t, dev};
  int vmm = 0;
  t.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (vmm == 0) {
    throw driver_failure("stress --pinned: this driver cannot make host memory through the VMM "
                         "API (CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED "
                         "is 0)",
                         static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
  }
  int node = 0;
  t.device_get_attribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  node = std::max(node, 0);
  r.size = o.size != 0 ? o.size : r.capacity / 5 * 2;
  if (r.size > r.capacity) {
    throw usage_error("stress --pinned: --size " + conf::format_size(r.size) +
                      " is more than the capacity of " + conf::format_size(r.capacity));
  }
  {
    core::HostPool pool(t, node, ctx, 0, 1, r.capacity, 2 * r.capacity + GiB);
    r.page_size = pool.page();
    std::mt19937_64 rng(o.seed);
    std::vector<std::pair<void*, size_t>> live;
    std::map<size_t, size_t> torch_cached;  // power-of-two size -> blocks cached
    size_t torch_held = 0;
    // Fill to about 90% of the capacity, then free in random order until what is live leaves
    // room for the buffer (with a page to spare for packing), as an offloading server does.
    for (;;) {
      const size_t n = block_size(rng, r.capacity);
      if (pool.stats().pinned_bytes + n > r.capacity / 10 * 9) break;
      void* p = pool.allocate(n, nullptr, 0);
      std::memset(p, 0x5a, std::min<size_t>(n, 64));
      live.emplace_back(p, n);
      torch_held += models::torch_host_block_bytes(n);
      ++r.blocks_made;
    }
    std::shuffle(live.begin(), live.end(), rng);
    size_t live_bytes = 0;
    for (const auto& b : live) live_bytes += (b.second + r.page_size - 1) / r.page_size * r.page_size;
    while (!live.empty() && live_bytes + r.size > r.capacity - r.page_size) {
      const auto [p, n] = live.back();
      live.pop_back();
      pool.free(p, nullptr);
      live_bytes -= (n + r.page_size - 1) / r.page_size * r.page_size;
      ++torch_cached[models::torch_host_block_bytes(n)];
    }
    const core::HostPoolStats before = pool.stats();
    r.live_at_request = before.allocated_bytes;
    r.pinned_at_request = before.pinned_bytes;
    for (const auto& b : live) r.torch_live_pinned += models::torch_host_block_bytes(b.second);
    r.torch_pinned_at_request = torch_held;
    r.torch_request_pinned = models::torch_host_block_bytes(r.size);
    const bool cached_fits = torch_cached[r.torch_request_pinned] > 0;
    r.torch_fits = cached_fits || torch_held + r.torch_request_pinned <= r.capacity;
    r.torch_fits_after_empty_cache = r.torch_live_pinned + r.torch_request_pinned <= r.capacity;
    // Holes: runs of free memory between live blocks.
    std::vector<std::pair<uintptr_t, size_t>> spans;
    for (const auto& b : live) spans.emplace_back(reinterpret_cast<uintptr_t>(b.first), b.second);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      const uintptr_t end = spans[i - 1].first + spans[i - 1].second;
      if (spans[i].first >= end + r.page_size) ++r.free_holes;
    }
    void* buf = nullptr;
    try {
      buf = pool.allocate(r.size, nullptr, 0);
      r.allocated = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    if (r.allocated) {
      // One word per page written, then read back: every page is there, and they are distinct.
      auto* b = static_cast<unsigned char*>(buf);
      for (size_t off = 0; off < r.size; off += r.page_size) {
        const uint64_t w = 0x9e3779b97f4a7c15ull ^ off;
        std::memcpy(b + off, &w, 8);
      }
      r.verified = true;
      for (size_t off = 0; off < r.size; off += r.page_size) {
        uint64_t w = 0;
        std::memcpy(&w, b + off, 8);
        if (w != (0x9e3779b97f4a7c15ull ^ off)) r.verified = false;
        ++r.pages_verified;
      }
      for (const auto& bl : live) {
        if (static_cast<unsigned char*>(bl.first)[0] != 0x5a) r.verified = false;
      }
      pool.free(buf, nullptr);
    }
    const core::HostPoolStats after = pool.stats();
    r.remapped_pages = after.num_remapped_pages - before.num_remapped_pages;
    r.peak_pinned = after.peak_pinned_bytes;
    for (const auto& b : live) pool.free(b.first, nullptr);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace expanse::replay
