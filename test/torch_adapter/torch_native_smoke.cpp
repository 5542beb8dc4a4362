// The torch half of the native allocator (torch_allocator.cpp) run against real c10 libraries
// and expanse on the sim, without a GPU: what PyTorch reads through the CUDAAllocator interface
// that needs no CUDA call (memory_stats, snapshots, the memory fraction, empty_cache, memory
// pools as CUDA graphs and MemPool drive them, the errors of checkpoints and IPC). Allocation
// itself asks the CUDA runtime for the current device, so it is left to
// test/gpu/torch_native_checks.py; here the pool cases allocate with expanse_malloc_checked, the
// call allocate() makes. Built only with EXPANSE_TORCH_INCLUDE and
// EXPANSE_TORCH_LIB (test/torch_compile_check.sh does), as it links c10 from a torch wheel.
#define EXPANSE_TORCH_NATIVE_WITHOUT_INSTALL
#include "torch_allocator.cpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// Set to make the trace tracker and the context recorder below throw, as a Python callback may.
std::atomic<bool> g_fail_after_alloc{false};

// What a trace tracker saw.
struct Tracked {
  int action;
  uint64_t addr;
  uint64_t size;
};
std::mutex g_tracked_mu;
std::vector<Tracked> g_tracked;

std::shared_ptr<c10::GatheredContext> failing_recorder() {
  if (g_fail_after_alloc.load()) throw std::runtime_error("the context recorder failed");
  return nullptr;
}

uint64_t live_blocks(int device) {
  expanse_stats s{};
  expanse::torch_adapter::read_stats(device, s);
  return s.live_blocks;
}

template <class F>
bool throws(F&& f) {
  try {
    f();
  } catch (const std::exception&) {
    return true;
  }
  return false;
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
  if (expanse_init("driver:sim,sim_devices:2,sim_capacity:1GiB") != EXPANSE_OK) {
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

  // ---- a device expanse never set up (device 1): the stats calls answer without setting it up
  // (on a GPU, setting it up would retain a CUDA context there) ----
  {
    const auto d1 = a.getDeviceStats(1);
    a.resetPeakStats(1);
    a.resetAccumulatedStats(1);
    const double f1 = a.getMemoryFraction(1);
    expanse_stats s1{};
    expanse::torch_adapter::read_stats(1, s1);
    expect(s1.page_size == 0 && s1.driver_calls_total == 0,
           "getDeviceStats, resetPeakStats, resetAccumulatedStats, getMemoryFraction of device 1 "
           "leave it unset (page_size " + std::to_string(s1.page_size) + ")");
    expect(d1.reserved_bytes[A].current == 0 && d1.allocation[A].allocated == 0 && f1 == 1.0,
           "device 1 never set up: zeros, fraction 1");
    a.setMemoryFraction(0.3, 1);  // sets it up
    expect(a.getMemoryFraction(1) == 0.3, "setMemoryFraction(0.3) of a device not set up reads back");
    a.setMemoryFraction(1.0, 1);
  }
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

  // recordHistory as torch.cuda.memory._record_memory_history calls it (clear_history: 2.7+).
  auto record = [&](bool enabled, cca::CreateContextFn recorder, bool clear) {
    a.recordHistory(enabled, recorder, 1000,
                    recorder ? cca::RecordContext::ALLOC : cca::RecordContext::NEVER
#if EXPANSE_TORCH_RECORD_HISTORY_ARGS >= 5
                    , clear
#endif
#if EXPANSE_TORCH_RECORD_HISTORY_ARGS >= 6
                    , {}
#endif
    );
    (void)clear;
  };
  record(true, nullptr, false);
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
  auto traced_alloc_of = [&](void* block) {
    const auto snap_now = a.snapshot();
    for (const auto& e : snap_now.device_traces.at(0)) {
      if (e.action_ == decltype(e.action_)::ALLOC && e.addr_ == reinterpret_cast<size_t>(block)) {
        return true;
      }
    }
    return false;
  };
#if EXPANSE_TORCH_RECORD_HISTORY_ARGS >= 5
  record(true, nullptr, /*clear=*/false);
  expect(traced_alloc_of(p), "recordHistory again with clear_history=False keeps the trace");
  record(true, nullptr, /*clear=*/true);
  expect(!traced_alloc_of(p), "recordHistory with clear_history=True starts a new trace");
#endif

  // ---- allocate() and raw_alloc on the sim (the device and stream given, not read from the
  // CUDA runtime) ----
  {
    const uint64_t live0 = live_blocks(0);
    {
      c10::DataPtr t = impl.allocate_on(1 << 20, 0, nullptr);
      expect(t.get() != nullptr && live_blocks(0) == live0 + 1, "allocate_on: one live block");
    }
    expect(live_blocks(0) == live0, "the DataPtr's deleter frees it");
    // What runs after expanse allocated (trace trackers, recordHistory's context recorder) may
    // throw: the block goes back before the error leaves.
    a.attachAllocatorTraceTracker([](const expanse::torch_native::TraceT& e) {
      if (g_fail_after_alloc.load() && e.action_ == expanse::torch_native::TraceT::ALLOC) {
        throw std::runtime_error("the trace tracker failed");
      }
    });
    g_fail_after_alloc = true;
    expect(throws([&] { c10::DataPtr t = impl.allocate_on(1 << 20, 0, nullptr); }) &&
               live_blocks(0) == live0,
           "allocate: a trace tracker that throws leaves no block behind");
    expect(throws([&] { impl.raw_alloc_on(1 << 20, 0, nullptr); }) && live_blocks(0) == live0,
           "raw_alloc: a trace tracker that throws leaves no block behind");
    g_fail_after_alloc = false;
    record(true, &failing_recorder, false);
    g_fail_after_alloc = true;
    expect(throws([&] { c10::DataPtr t = impl.allocate_on(4096, 0, nullptr); }) &&
               live_blocks(0) == live0,
           "allocate: a context recorder that throws leaves no block behind");
    g_fail_after_alloc = false;
    void* r = impl.raw_alloc_on(4096, 0, nullptr);
    expect(r != nullptr && live_blocks(0) == live0 + 1, "raw_alloc works again afterwards");
    impl.raw_delete(r);
    record(false, nullptr, false);

    // Trackers see every free, raw_delete's too, with the size its alloc had (PyTorch's entries
    // carry the block's requested size).
    a.attachAllocatorTraceTracker([](const expanse::torch_native::TraceT& e) {
      std::lock_guard<std::mutex> lock(g_tracked_mu);
      g_tracked.push_back({static_cast<int>(e.action_), static_cast<uint64_t>(e.addr_),
                           static_cast<uint64_t>(e.size_)});
    });
    void* raw = impl.raw_alloc_on(12345, 0, nullptr);
    impl.raw_delete(raw);
    void* tensor = nullptr;
    {
      c10::DataPtr t = impl.allocate_on(6789, 0, nullptr);
      tensor = t.get();
    }
    using Action = expanse::torch_native::TraceT;
    auto tracked = [&](void* at, uint64_t n) {
      std::vector<int> actions;
      std::lock_guard<std::mutex> lock(g_tracked_mu);
      for (const Tracked& e : g_tracked) {
        if (e.addr == reinterpret_cast<uint64_t>(at) && e.size == n) actions.push_back(e.action);
      }
      return actions == std::vector<int>{static_cast<int>(Action::ALLOC),
                                         static_cast<int>(Action::FREE_REQUESTED),
                                         static_cast<int>(Action::FREE_COMPLETED)};
    };
    expect(tracked(raw, 12345), "trackers: raw_alloc, then raw_delete's free, with its size");
    expect(tracked(tensor, 6789), "trackers: a tensor's alloc and free, with its size");
  }

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

  // ---- memory pools, as torch.cuda.graph drives them ----
  using expanse::torch_native::MempoolId;
  const MempoolId graph{1, 0};  // a graph's own pool: {uuid, 0}
  auto pool_of = [](void* block) {
    expanse_pool_id id = 0;
    return expanse_pool_of(block, &id) == EXPANSE_OK ? id : ~0ull;
  };
  expect(a.getPoolUseCount(0, graph) == 0, "getPoolUseCount of a pool never begun: 0");
  a.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; });
  void* in_pool = nullptr;  // what allocate() calls, on the capture's stream
  expanse_malloc_checked(&in_pool, 1 << 20, 0, nullptr);
  a.endAllocateToPool(0, graph);
  void* after = expanse_malloc(1 << 20, 0, nullptr);
  const expanse_pool_id gid = pool_of(in_pool);
  expanse_pool_stats ps{};
  ps.struct_size = sizeof ps;
  expect(gid != 0 && gid != ~0ull && expanse_pool_get_stats(gid, &ps) == EXPANSE_OK &&
             ps.live_blocks == 1 && ps.use_count == 1,
         "beginAllocateToPool routes to an expanse pool (use count 1, the block its)");
  expect(pool_of(after) == 0, "after endAllocateToPool: the default pool");
  expect(a.getPoolUseCount(0, graph) == 1, "getPoolUseCount: 1");
  expect(a.checkPoolLiveAllocations(0, graph, {in_pool}), "checkPoolLiveAllocations: exactly it");
  expect(!a.checkPoolLiveAllocations(0, graph, {}), "checkPoolLiveAllocations: not none");
  expect(!a.checkPoolLiveAllocations(0, graph, {in_pool, after}),
         "checkPoolLiveAllocations: not with a default-pool block");
  a.beginAllocateToPool(0, graph, [](cudaStream_t) { return false; });  // a second graph
  expect(a.getPoolUseCount(0, graph) == 2, "a second begin retains: 2");
  a.endAllocateToPool(0, graph);
  a.releasePool(0, graph);
  a.releasePool(0, graph);
  expect(a.getPoolUseCount(0, graph) == 0, "releasePool twice: 0");
  const std::string again =
      error_of([&] { a.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; }); });
  expect(again.find("memory pool (1, 0) on device 0 was released") != std::string::npos,
         "beginning a released pool that holds memory raises naming it: " + again.substr(0, 90));
  const std::string not_begun = error_of([&] { a.endAllocateToPool(0, {7, 0}); });
  expect(not_begun.find("(7, 0)") != std::string::npos, "endAllocateToPool without begin raises");
  expanse_free(in_pool, 0, 0, nullptr);
  expanse_free(after, 0, 0, nullptr);
#if EXPANSE_TORCH_EMPTY_CACHE_TAKES_POOL
  a.emptyCache(graph);  // released: its memory goes back, and the pair is forgotten
#else
  a.emptyCache();
#endif
  a.beginAllocateToPool(0, graph, [](cudaStream_t) { return true; });
  expect(a.getPoolUseCount(0, graph) == 1,
         "once empty_cache gave its memory back, the pair names a new pool");
  a.endAllocateToPool(0, graph);
  a.releasePool(0, graph);

  // ---- torch.cuda.MemPool and use_mem_pool ----
  const MempoolId mem{0, 1};  // a MemPool's id: {0, uid}
  ExpanseAllocator other;
#if EXPANSE_TORCH_POOL_INCREF_FORM == 2
  a.createOrIncrefPool(0, mem, nullptr);
  a.createOrIncrefPool(0, mem, nullptr);
  const std::string foreign = error_of([&] {
    a.createOrIncrefPool(0, {0, 2}, std::shared_ptr<cca::CUDAAllocator>(&other, [](void*) {}));
  });
#elif EXPANSE_TORCH_POOL_INCREF_FORM == 1
  a.createOrIncrefPool(0, mem, nullptr);
  a.createOrIncrefPool(0, mem, nullptr);
  const std::string foreign = error_of([&] { a.createOrIncrefPool(0, {0, 2}, &other); });
#else
  a.ensureExistsAndIncrefPool(0, mem);
  a.ensureExistsAndIncrefPool(0, mem);
  const std::string foreign = "MemPool(allocator=";  // 2.6 passes no allocator here
#endif
  expect(a.getPoolUseCount(0, mem) == 2, "createOrIncrefPool twice: use count 2");
  expect(foreign.find("MemPool(allocator=") != std::string::npos,
         "a MemPool with an allocator of its own raises");
#if EXPANSE_TORCH_HAS_POOL_OPTIONS
  a.setNoSplit(0, mem);  // accepted: nothing to keep whole
  a.setUseOnOOM(0, mem, true);
  expect(error_of([&] { a.setUseOnOOM(0, {0, 9}, true); }).find("(0, 9)") != std::string::npos,
         "setUseOnOOM of a pool never created raises naming it");
#endif
  const auto me = std::this_thread::get_id();
  a.beginAllocateToPool(0, mem, [me](cudaStream_t) { return std::this_thread::get_id() == me; });
  void* mine = expanse_malloc(4096, 0, nullptr);
  void* theirs = nullptr;
  std::thread([&] { theirs = expanse_malloc(4096, 0, nullptr); }).join();
  a.endAllocateToPool(0, mem);
  a.releasePool(0, mem);  // use_mem_pool's exit
  expect(pool_of(mine) != 0 && pool_of(theirs) == 0,
         "use_mem_pool's thread filter: this thread's allocation only");
  expect(a.checkPoolLiveAllocations(0, mem, {mine}), "the MemPool's live allocation");
  expect(a.getPoolUseCount(0, mem) == 2, "use count back to 2");
  expanse_free(mine, 0, 0, nullptr);
  expanse_free(theirs, 0, 0, nullptr);
  a.releasePool(0, mem);
  a.releasePool(0, mem);  // ~MemPool
  expect(a.getPoolUseCount(0, mem) == 0, "released: 0");

  const std::string trees = error_of([&] { a.getCheckpointState(0, graph); });
  expect(trees.find("cudagraph_trees = False") != std::string::npos,
         "getCheckpointState raises naming the way around: " + trees.substr(0, 80));
#if EXPANSE_TORCH_SNAPSHOT_ARGS >= 1
  expect(error_of([&] { a.snapshot(mem); }).find("one memory pool (0, 1)") != std::string::npos,
         "a snapshot of one pool raises naming it");
#endif
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
