// The torch half of the native allocator (torch_allocator.cpp) run against real c10 libraries
// and expanse on the sim, without a GPU: what PyTorch reads through the CUDAAllocator interface
// that needs no CUDA call (memory_stats, snapshots, the memory fraction, empty_cache, the errors
// of pools and IPC). Allocation itself asks the CUDA runtime for the current device, so it is
// left to test/gpu/torch_native_checks.py. Built only with EXPANSE_TORCH_INCLUDE and
// EXPANSE_TORCH_LIB (test/torch_compile_check.sh does), as it links c10 from a torch wheel.
#define EXPANSE_TORCH_NATIVE_WITHOUT_INSTALL
#include "torch_allocator.cpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

int main() {
  using expanse::torch_native::ExpanseAllocator;
  namespace cca = c10::cuda::CUDACachingAllocator;
  if (expanse_init("driver:sim,sim_capacity:1GiB") != EXPANSE_OK) {
    std::printf("FAIL  expanse_init: %s\n", expanse_last_error());
    return 1;
  }
  ExpanseAllocator impl;
  cca::CUDAAllocator& a = impl;  // as PyTorch calls it, with the interface's default arguments
  expanse::torch_native::g_installed = &impl;  // what installing sets (deleters reach it)
  a.init(1);
  expect(a.initialized(), "init(1) on the sim");

  void* small = expanse_malloc(4096, 0, nullptr);
  void* large = expanse_malloc(8 << 20, 0, nullptr);
  expanse_stats s{};
  expanse::torch_adapter::read_stats(0, s);
  const auto d = a.getDeviceStats(0);
  const auto A = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto S = static_cast<size_t>(c10::CachingAllocator::StatType::SMALL_POOL);
  const auto L = static_cast<size_t>(c10::CachingAllocator::StatType::LARGE_POOL);
  expect(d.allocated_bytes[A].current == static_cast<int64_t>(s.allocated_bytes),
         "memory_stats allocated_bytes.all.current is expanse's allocated_bytes");
  expect(d.reserved_bytes[A].current == static_cast<int64_t>(s.physical_bytes),
         "reserved_bytes.all.current is expanse's physical_bytes");
  expect(d.allocation[S].current == 1 && d.allocation[L].current == 1,
         "one allocation in each pool");
  expect(d.allocation[A].allocated == 2, "allocation.all.allocated counts both");
  expect(d.max_split_size == -1, "max_split_size: no limit");

  const auto snap = a.snapshot();
  size_t blocks = 0, live = 0;
  for (const auto& seg : snap.segments) {
    for (const auto& b : seg.blocks) {
      ++blocks;
      live += b.allocated ? 1 : 0;
    }
  }
  expect(snap.segments.size() >= 2 && live == 2 && blocks >= 2,
         "snapshot: segments of both arenas, both live blocks (" + std::to_string(blocks) +
             " blocks)");
  expect(snap.config_metadata.expandable_segments, "snapshot: expandable segments");

  a.recordHistory(true, nullptr, 1000, cca::RecordContext::ALLOC
#if EXPANSE_TORCH_RECORD_HISTORY_ARGS >= 5
                  , false
#endif
#if EXPANSE_TORCH_RECORD_HISTORY_ARGS >= 6
                  , {}
#endif
  );
  void* p = expanse_malloc(1 << 20, 0, nullptr);
  expanse_free(p, 0, 0, nullptr);
  const auto traced = a.snapshot();
  bool alloc_seen = false, free_seen = false;
  for (const auto& e : traced.device_traces.at(0)) {
    alloc_seen = alloc_seen || (e.action_ == decltype(e.action_)::ALLOC && e.addr_ == reinterpret_cast<size_t>(p));
    free_seen = free_seen || (e.action_ == decltype(e.action_)::FREE_COMPLETED && e.addr_ == reinterpret_cast<size_t>(p));
  }
  expect(a.isHistoryEnabled() && alloc_seen && free_seen,
         "recordHistory: the trace has the alloc and free_completed of a block");

  a.setMemoryFraction(0.5, 0);
  expect(a.getMemoryFraction(0) == 0.5, "setMemoryFraction(0.5) reads back");
  expanse::torch_adapter::read_stats(0, s);
  expect(s.limit_bytes == 512ull << 20, "the fraction is expanse's limit");
  a.setMemoryFraction(0.3, 0);  // not a whole number of pages: the limit is rounded down
  expect(a.getMemoryFraction(0) == 0.3, "setMemoryFraction(0.3) reads back as set");
  a.setMemoryFraction(1.0, 0);
  expect(a.getMemoryFraction(0) == 1.0, "setMemoryFraction(1.0) reads back");
  expect(error_of([&] { a.setMemoryFraction(1.5, 0); }).find("[0, 1]") != std::string::npos,
         "a fraction above 1 is refused");

  a.resetPeakStats(0);
  a.resetAccumulatedStats(0);
  const auto r = a.getDeviceStats(0);
  expect(r.allocation[A].allocated == 0 && r.allocated_bytes[A].peak == r.allocated_bytes[A].current,
         "resets: accumulations from 0, peaks at current");

  const std::string pools = error_of([&] { a.beginAllocateToPool(0, {1, 0}, [](cudaStream_t) { return true; }); });
  expect(pools.find("memory pools") != std::string::npos &&
             pools.find("native=False") != std::string::npos,
         "beginAllocateToPool raises naming pools and the way around: " + pools.substr(0, 80));
  expect(error_of([&] { a.releasePool(0, {1, 0}); }).find("memory pools") != std::string::npos,
         "releasePool raises");
  expect(error_of([&] { a.getPoolUseCount(0, {1, 0}); }).find("memory pools") != std::string::npos,
         "getPoolUseCount raises");
  expect(error_of([&] { a.shareIpcHandle(small); }).find("not supported by expanse yet") != std::string::npos,
         "IPC raises");
  expect(a.name() == "expanse", "name()");

  expanse_free(small, 0, 0, nullptr);
  expanse_free(large, 0, 0, nullptr);
  a.emptyCache();
  expanse::torch_adapter::read_stats(0, s);
  expect(s.mapped_bytes == 0 && a.getDeviceStats(0).reserved_bytes[A].current == 0,
         "emptyCache releases every cached page");
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
