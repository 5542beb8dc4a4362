// expanse as PyTorch's CUDA host allocator (python/expanse/native/torch_host_allocator.cpp) run
// against a real libtorch_cpu and expanse on the sim, without a GPU: installed through
// at::setHostAllocator, the allocator at::getHostAllocator(kCUDA) returns is expanse's, its blocks
// are exact, a slice's record_event orders its reuse, the deleter frees it, and the stats are
// the host pools'. Built only with EXPANSE_TORCH_INCLUDE and an EXPANSE_TORCH_LIB that holds
// libtorch_cpu.so (a whole torch lib folder, not test/torch_compile_check.sh's two c10 libraries).
#include "torch_host_allocator.cpp"

#include <cstdio>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

expanse_host_stats host_stats() {
  expanse_host_stats s{};
  s.struct_size = sizeof s;
  expanse_host_get_stats(-1, &s);
  return s;
}

constexpr size_t MiB = size_t{1} << 20;

}  // namespace

int main() {
  if (expanse_init("driver:sim,sim_capacity:1GiB,sim_host_capacity:256MiB") != EXPANSE_OK) {
    std::printf("FAIL  expanse_init: %s\n", expanse_last_error());
    return 1;
  }
  expect(expanse_torch_native_install_host() == 0,
         std::string("installed: ") + expanse_torch_native_host_error());
  expect(expanse_torch_native_host_installed() == 1, "at::getHostAllocator(kCUDA) is expanse's");
  expect(expanse_torch_native_install_host() == 0, "a second install does nothing");
  at::HostAllocator* a = at::getHostAllocator(at::kCUDA);

  {
    at::DataPtr d = a->allocate(20 * MiB + 1);
    expect(d.get() != nullptr && d.get_context() == d.get(), "a block, its context its start");
    const expanse_host_stats s = host_stats();
    expect(s.requested_bytes == 20 * MiB + 1 && s.allocated_bytes == 22 * MiB,
           "exact to the 2 MiB granularity (a power of two pins 32 MiB): " +
               std::to_string(s.allocated_bytes));
    static_cast<unsigned char*>(d.get())[20 * MiB] = 0x5a;
    // A non_blocking copy from a slice records the slice's pointer with the block's context.
    const c10::Stream legacy(c10::Stream::DEFAULT, c10::Device(at::kCUDA, 0));
    expect(a->record_event(static_cast<char*>(d.get()) + 4096, d.get_context(), legacy),
           "record_event on a slice of the block");
    const at::HostStats hs = a->get_stats();
    expect(hs.active_requests.current == 1 && hs.allocated_bytes.current == 22 * MiB,
           "PyTorch's host stats are the pools'");
  }  // the DataPtr's deleter
  {
    const expanse_host_stats s = host_stats();
    expect(s.live_blocks == 0 && s.num_frees == 1, "the deleter freed the block");
  }
  {
    // A tensor over expanse's memory made by another allocator's hands (DLPack, from_blob):
    // its context is not the block, and record_event finds the block by the pointer.
    void* p = nullptr;
    expect(expanse_host_malloc(&p, MiB, -1, nullptr) == EXPANSE_OK, "a block for a foreign ctx");
    int foreign = 0;
    const c10::Stream legacy(c10::Stream::DEFAULT, c10::Device(at::kCUDA, 0));
    expect(a->record_event(static_cast<char*>(p) + 100, &foreign, legacy),
           "record_event finds the block by its pointer");
    int local = 0;
    expect(!a->record_event(&local, &local, legacy), "pageable memory: not recorded");
    expect(expanse_host_free(p, nullptr) == EXPANSE_OK, "freed");
  }
#if EXPANSE_TORCH_HOST_ALLOCATOR_HAS_POOLS
  {
    // A CUDA graph's pinned block is the graph's until its pool is released.
    const c10::MempoolId_t pool{0, 7};
    a->begin_allocate_to_pool(pool, [](c10::Stream) { return true; });
    at::DataPtr g = a->allocate(3 * MiB);
    a->end_allocate_to_pool(pool);
    const uint64_t live = host_stats().live_blocks;
    g.clear();  // the capture's tensor dies: the graph still reads the block at every replay
    expect(host_stats().live_blocks == live, "a captured block is held after its deleter");
    // A second graph shares the pool: the first one's release leaves the block to it.
    a->begin_allocate_to_pool(pool, [](c10::Stream) { return false; });
    a->end_allocate_to_pool(pool);
    a->release_pool(pool);
    expect(host_stats().live_blocks == live, "a pool another graph uses keeps its blocks");
    a->release_pool(pool);
    expect(host_stats().live_blocks == live - 1, "the pool's last release frees them");
    at::DataPtr after = a->allocate(MiB);
    after.clear();
    expect(host_stats().live_blocks == live - 1, "after the capture, blocks free as before");
  }
#endif
  at::DataPtr zero = a->allocate(0);
  expect(zero.get() == nullptr, "0 bytes: no block");
  a->empty_cache();
  a->reset_peak_stats();
  expect(host_stats().peak_pinned_bytes == host_stats().pinned_bytes,
         "reset_peak_stats starts the peak from now");
  expect(expanse_shutdown() == EXPANSE_OK, std::string("shutdown: ") + expanse_last_error());
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
