// expanse as PyTorch's own CUDA allocator: a c10::cuda::CUDACachingAllocator::CUDAAllocator over
// expanse's C API, installed the way PyTorch installs a replacement (changeCurrentAllocator: the
// pointer every CUDA allocation reads). Built against the user's torch by expanse.torch.use()
// (torch.utils.cpp_extension), and against real torch headers by test/torch_compile_check.sh.
//
// Memory pools (CUDA graph capture, torch.cuda.MemPool) are expanse pools, found by PyTorch's pool
// id (torch_adapter.hpp: PoolMap). What expanse's books cannot answer raises a c10::Error that
// says so: the checkpoints of cudagraph trees, a snapshot of one pool, IPC.
// Version differences: torch_version.hpp, and nowhere else.
#include "torch_adapter.hpp"
#include "torch_version.hpp"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#ifndef EXPANSE_TORCH_NATIVE_WITHOUT_INSTALL
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace expanse::torch_native {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace ta = expanse::torch_adapter;

// c10's types, named through the structs that hold them: their namespaces moved between versions
// (c10::cuda::CUDACachingAllocator before 2.8, c10::CachingDeviceAllocator after), the members
// did not.
using DeviceStatsT = c10::CachingDeviceAllocator::DeviceStats;
using StatArrayT = decltype(DeviceStatsT::allocation);
using StatT = decltype(DeviceStatsT::oversize_allocations);
using SnapshotT = cca::SnapshotInfo;
using SegmentT = decltype(SnapshotT::segments)::value_type;
using BlockT = decltype(SegmentT::blocks)::value_type;
using TraceT = decltype(SnapshotT::device_traces)::value_type::value_type;
// c10::MempoolId_t since 2.8, c10::cuda::MempoolId_t before; the latter names it in both.
using MempoolId = c10::cuda::MempoolId_t;

// cudagraph trees (torch.compile(mode="reduce-overhead")'s default) checkpoint a pool's blocks and
// rebuild them later; expanse cannot re-create blocks at given addresses.
[[noreturn]] void checkpoints_missing(const char* what) {
  TORCH_CHECK(false, "expanse: ", what, " (torch.compile's CUDA graph trees, the default of "
              "mode=\"reduce-overhead\") is not supported by expanse's native allocator: it "
              "cannot save a memory pool's blocks and re-create them at the same addresses. "
              "Turn the trees off and keep CUDA graphs: "
              "torch._inductor.config.triton.cudagraph_trees = False (inductor then captures "
              "each graph with torch.cuda.graph into a pool of its own), or compile without "
              "mode=\"reduce-overhead\".");
}

ta::MempoolKey key(c10::DeviceIndex device, const MempoolId& id) {
  return ta::MempoolKey{static_cast<int>(device), static_cast<uint64_t>(id.first),
                        static_cast<uint64_t>(id.second)};
}

// Runs a PoolMap call; its PoolError becomes the c10::Error Python sees as a RuntimeError.
template <class F>
auto pool_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ta::PoolError& e) {
    TORCH_CHECK(false, "expanse: ", e.what());
  }
}

[[noreturn]] void expanse_failed(const char* what) {
  TORCH_CHECK(false, "expanse: ", what, " failed: ", expanse_last_error());
}

void check(int rc, const char* what) {
  if (rc != EXPANSE_OK) expanse_failed(what);
}

ta::Segments segments_of(int device) {
  ta::Segments s;
  check(ta::read_segments(device, s), "expanse_get_segments");
  return s;
}

expanse_stats stats_of(int device) {
  expanse_stats s;
  check(ta::read_stats(device, s), "expanse_get_stats");
  return s;
}

void copy_stat(StatT& to, const ta::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_stats(StatArrayT& to, const ta::StatArray& from) {
  for (size_t k = 0; k < ta::kNumPools; ++k) copy_stat(to[k], from[k]);
}

// What a tensor's DataPtr carries to its deleter: expanse frees in stream order, on the stream
// the block was allocated on (PyTorch's own allocator does the same with its Block).
struct Allocation {
  void* ptr;
  cudaStream_t stream;
  int device;
  size_t size;  // as asked for: trace trackers see it in the free's entries, as PyTorch's do
};

class ExpanseAllocator;
ExpanseAllocator* g_installed = nullptr;  // set once; never freed (tensors may outlive Python)

void delete_allocation(void* ctx);

class ExpanseAllocator final : public cca::CUDAAllocator {
 public:
  // ---- allocation ------------------------------------------------------------------------
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex dev = c10::cuda::current_device();
    return allocate_on(n, dev, c10::cuda::getCurrentCUDAStream(dev).stream());
  }

  // allocate() on a given device and stream (what it reads from the CUDA runtime): the smoke
  // test on the sim calls it directly.
  c10::DataPtr allocate_on(size_t n, c10::DeviceIndex dev, cudaStream_t stream) {
    if (n == 0) return {nullptr, nullptr, &delete_allocation, c10::Device(c10::DeviceType::CUDA, dev)};
    void* p = malloc_or_throw(n, dev, stream);
    Allocation* a = nullptr;
    try {
      a = new Allocation{p, stream, dev, n};
    } catch (...) {  // out of host memory: the block goes back before the error leaves
      give_back(p, dev, stream);
      throw;
    }
    try {
      after_alloc(p, n, dev, stream);
    } catch (...) {  // a trace tracker or the context recorder threw: nothing may be left behind
      delete a;
      give_back(p, dev, stream);
      throw;
    }
    return {p, a, &delete_allocation, c10::Device(c10::DeviceType::CUDA, dev)};
  }

  // The DataPtrs above carry an Allocation, not the pointer, as context (as PyTorch's own
  // CUDAPluggableAllocator's carry its deleter context), so there is no raw deleter: c10's
  // raw_allocate / raw_deallocate (which need the two equal) are served by raw_alloc /
  // raw_delete instead.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  void* raw_alloc(size_t n) override {
    const c10::DeviceIndex dev = c10::cuda::current_device();
    return raw_alloc_with_stream(n, c10::cuda::getCurrentCUDAStream(dev).stream());
  }

  void* raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    if (n == 0) return nullptr;
    return raw_alloc_on(n, c10::cuda::current_device(), stream);
  }

  // raw_alloc_with_stream on a given device (the smoke test calls it directly).
  void* raw_alloc_on(size_t n, c10::DeviceIndex dev, cudaStream_t stream) {
    if (n == 0) return nullptr;
    void* p = malloc_or_throw(n, dev, stream);
    try {
      {
        std::lock_guard<std::mutex> lock(raw_mu_);
        raw_[p] = Allocation{p, stream, dev, n};
      }
      after_alloc(p, n, dev, stream);
    } catch (...) {  // as in allocate_on
      {
        std::lock_guard<std::mutex> lock(raw_mu_);
        raw_.erase(p);
      }
      give_back(p, dev, stream);
      throw;
    }
    return p;
  }

  void raw_delete(void* ptr) override {
    if (ptr == nullptr) return;
    Allocation a{};
    {
      std::lock_guard<std::mutex> lock(raw_mu_);
      auto it = raw_.find(ptr);
      TORCH_CHECK(it != raw_.end(), "expanse: raw_delete of ", ptr,
                  ", which raw_alloc did not return (or which was already deleted)");
      a = it->second;
      raw_.erase(it);
    }
    // Trackers saw its alloc (after_alloc): they see its free too, as a tensor's, before the
    // memory can be handed out again. The block is freed whatever a tracker throws.
    try {
      if (have_trackers_.load(std::memory_order_relaxed)) track_free(a);
    } catch (...) {
      free_allocation(a);
      throw;
    }
    free_allocation(a);
  }

  void free_allocation(const Allocation& a) noexcept {
    if (history_contexts_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(history_mu_);
      contexts_.erase(a.ptr);
    }
    // A failure (a pointer expanse does not know) is counted and kept in expanse_last_error;
    // a deleter cannot throw.
    (void)expanse_free_checked(a.ptr, 0, a.device, reinterpret_cast<CUstream_st*>(a.stream));
  }

  // ---- setup -----------------------------------------------------------------------------
  void init(int device_count) override {
    const int n = expanse_device_count();
    TORCH_CHECK(n >= 0, "expanse: cannot start its driver for PyTorch: ", expanse_last_error());
    TORCH_CHECK(n >= device_count, "expanse sees ", n, " CUDA devices, PyTorch ", device_count,
                "; both must see the same devices (CUDA_VISIBLE_DEVICES)");
    {
      std::lock_guard<std::mutex> lock(books_mu_);
      baselines_.resize(static_cast<size_t>(n));
    }
    initialized_.store(true);
  }

  bool initialized() override { return initialized_.load(); }

  double getMemoryFraction(c10::DeviceIndex device) override {
    const expanse_stats s = stats_of(device);
    std::lock_guard<std::mutex> lock(books_mu_);
    return ta::memory_fraction(s, baseline(device));
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "expanse: invalid fraction ", fraction,
                ": set_per_process_memory_fraction takes a number in [0, 1]");
    const uint64_t limit = ta::limit_for_fraction(stats_of(device), fraction);
    check(expanse_set_limit(device, static_cast<size_t>(limit)), "expanse_set_limit");
    // The limit as expanse holds it: a device not set up before answered page_size 0, so the
    // limit asked for may not have been whole pages yet.
    const uint64_t held = stats_of(device).limit_bytes;
    std::lock_guard<std::mutex> lock(books_mu_);
    ta::remember_fraction(baseline(device), fraction, held == UINT64_MAX ? SIZE_MAX : held);
  }

#if EXPANSE_TORCH_EMPTY_CACHE_TAKES_POOL
  // A pool's: its memory goes back if it was released (MemPool's destructor calls this), a live
  // pool's stays, as with PyTorch's allocator.
  void emptyCache(MempoolId mempool_id) override {
    if (mempool_id != MempoolId{0, 0}) {
      pool_call([&] { pools_.empty_cache(mempool_id.first, mempool_id.second); });
      return;
    }
    release_all();
  }
#else
  void emptyCache() override { release_all(); }
#endif

  // torch.cuda.memory.caching_allocator_enable(False): expanse has no uncached mode.
  void enable(bool value) override {
    TORCH_CHECK(value, "expanse: its native PyTorch allocator cannot be disabled "
                       "(caching_allocator_enable(False) is not supported); cached memory goes "
                       "back to the driver with torch.cuda.empty_cache()");
  }
  bool isEnabled() const override { return true; }

  // ---- what cuDNN and friends ask --------------------------------------------------------
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    uint64_t device_free = UINT64_MAX;
    size_t free = 0, total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        device_free = free;
      } else {
        (void)cudaGetLastError();  // not sticky; the answer falls back to expanse's capacity
      }
    }
    *largestBlock = static_cast<size_t>(ta::largest_block(stats_of(device), device_free));
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    const auto p = reinterpret_cast<uint64_t>(ptr);
    const int n = expanse_device_count();
    for (int d = 0; d < n; ++d) {
      for (const auto& s : segments_of(d).segments) {
        if (p >= s.address && p < s.address + s.size) {
          if (size != nullptr) *size = static_cast<size_t>(s.size);
          return reinterpret_cast<void*>(s.address);
        }
      }
    }
    TORCH_CHECK(false, "expanse: getBaseAllocation of ", ptr, ": not memory expanse holds");
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // As PyTorch's own: pointers this allocator did not hand out are none of its business.
    if (ptr.get() == nullptr || ptr.get_deleter() != &delete_allocation) return;
    check(expanse_record_stream(ptr.get(), reinterpret_cast<CUstream_st*>(stream.stream())),
          "record_stream");
  }

  // ---- statistics ------------------------------------------------------------------------
  DeviceStatsT getDeviceStats(c10::DeviceIndex device) override {
    const expanse_stats s = stats_of(device);
    const ta::Segments segs = segments_of(device);
    ta::DeviceStats d;
    {
      std::lock_guard<std::mutex> lock(books_mu_);
      d = ta::map_device_stats(s, segs, baseline(device));
    }
    DeviceStatsT out;
    copy_stats(out.allocation, d.allocation);
    copy_stats(out.segment, d.segment);
    copy_stats(out.active, d.active);
    copy_stats(out.inactive_split, d.inactive_split);
    copy_stats(out.allocated_bytes, d.allocated_bytes);
    copy_stats(out.reserved_bytes, d.reserved_bytes);
    copy_stats(out.active_bytes, d.active_bytes);
    copy_stats(out.inactive_split_bytes, d.inactive_split_bytes);
    copy_stats(out.requested_bytes, d.requested_bytes);
    out.num_alloc_retries = d.num_alloc_retries;
    out.num_ooms = d.num_ooms;
    copy_stat(out.oversize_allocations, d.oversize_allocations);
    copy_stat(out.oversize_segments, d.oversize_segments);
    out.num_sync_all_streams = d.num_sync_all_streams;
    out.num_device_alloc = d.num_device_alloc;
    out.num_device_free = d.num_device_free;
    out.max_split_size = d.max_split_size;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    const expanse_stats s = stats_of(device);
    std::lock_guard<std::mutex> lock(books_mu_);
    ta::reset_accumulated(s, baseline(device));
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check(expanse_reset_peak_stats(device), "expanse_reset_peak_stats");
    std::lock_guard<std::mutex> lock(books_mu_);
    ta::reset_seen_peaks(baseline(device));
  }

#if EXPANSE_TORCH_SNAPSHOT_ARGS == 2
  SnapshotT snapshot(MempoolId mempool_id, bool include_traces) override {
    if (mempool_id != MempoolId{0, 0}) no_pool_snapshot(mempool_id);
    return make_snapshot(include_traces);
  }
#elif EXPANSE_TORCH_SNAPSHOT_ARGS == 1
  SnapshotT snapshot(MempoolId mempool_id) override {
    if (mempool_id != MempoolId{0, 0}) no_pool_snapshot(mempool_id);
    return make_snapshot(true);
  }
#else
  SnapshotT snapshot() override { return make_snapshot(true); }
#endif

#if EXPANSE_TORCH_HAS_GET_EXPANDABLE_SEGMENT_SIZES
  // One VA range per arena, shared by every stream.
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    const auto f = ta::pool_figures(segments_of(device));
    std::vector<cca::StreamSegmentSize> out;
    out.emplace_back(nullptr, true, static_cast<size_t>(f[ta::kSmallPool].segment_bytes));
    out.emplace_back(nullptr, false, static_cast<size_t>(f[ta::kLargePool].segment_bytes));
    return out;
  }
#endif

  // ---- memory pools (CUDA graphs, MemPool): expanse pools (torch_adapter.hpp: PoolMap) -------
  // CUDAGraph::capture_begin calls this before cudaStreamBeginCapture, with a filter that accepts
  // the streams of its capture; use_mem_pool with one that accepts the calling thread. The
  // capture itself is announced to expanse by expanse.torch.use()'s wrapper of
  // torch.cuda.CUDAGraph.capture_begin / capture_end (expanse.capture_begin / capture_end).
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    pool_call([&] { pools_.begin(key(device, mempool_id), std::move(filter)); });
  }
  void endAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id) override {
    pool_call([&] { pools_.end(key(device, mempool_id)); });
  }
  void releasePool(c10::DeviceIndex device, MempoolId mempool_id) override {
    pool_call([&] { pools_.release(key(device, mempool_id)); });
  }
  int getPoolUseCount(c10::DeviceIndex device, MempoolId mempool_id) override {
    return pool_call([&] { return pools_.use_count(key(device, mempool_id)); });
  }
#if EXPANSE_TORCH_POOL_INCREF_FORM == 2
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    check_pool_allocator(allocator.get());
    pool_call([&] { pools_.create_or_incref(key(device, mempool_id)); });
  }
#elif EXPANSE_TORCH_POOL_INCREF_FORM == 1
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId mempool_id,
                          cca::CUDAAllocator* allocator) override {
    check_pool_allocator(allocator);
    pool_call([&] { pools_.create_or_incref(key(device, mempool_id)); });
  }
#else
  void ensureExistsAndIncrefPool(c10::DeviceIndex device, MempoolId mempool_id) override {
    pool_call([&] { pools_.create_or_incref(key(device, mempool_id)); });
  }
#endif
#if EXPANSE_TORCH_HAS_POOL_OPTIONS
  // MemPool(use_on_oom=True): an allocation on the device that fails for lack of memory is tried
  // again in the pool's cached memory (malloc_or_throw).
  void setUseOnOOM(c10::DeviceIndex device, MempoolId mempool_id, bool use_on_oom) override {
    pool_call([&] { pools_.set_use_on_oom(key(device, mempool_id), use_on_oom); });
  }
  // MemPool(no_split=True) keeps PyTorch from carving an allocation out of a larger cached
  // segment of the pool, so that each allocation is a segment of its own. expanse has no such
  // segments: a block is carved from one VA range per arena, on pages mapped for it, and a
  // segment in its books is only a run of mapped pages. There is nothing to keep whole.
  void setNoSplit(c10::DeviceIndex, MempoolId) override {}
#endif
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId mempool_id,
                                const std::unordered_set<void*>& expected) override {
    return pool_call([&] { return pools_.live_allocations_are(key(device, mempool_id), expected); });
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex,
                                                          MempoolId) override {
    checkpoints_missing("getCheckpointState");
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex,
                                              std::shared_ptr<cca::AllocatorState>) override {
    checkpoints_missing("setCheckpointPoolState");
  }

  // ---- IPC: not in expanse yet -----------------------------------------------------------
  cca::ShareableHandle shareIpcHandle(void*) override {
    TORCH_CHECK(false, "expanse: sharing CUDA tensors between processes (IPC: "
                       "torch.multiprocessing, shareIpcHandle) is not supported by expanse yet; "
                       "share through PyTorch's own allocator (do not call expanse.torch.use() in "
                       "processes that share CUDA tensors)");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "expanse: opening CUDA tensors of another process (IPC: getIpcDevPtr) is "
                       "not supported by expanse yet; use PyTorch's own allocator in processes "
                       "that share CUDA tensors");
  }

  // ---- history and observers -------------------------------------------------------------
  bool isHistoryEnabled() override { return history_on_.load(); }

#if EXPANSE_TORCH_RECORD_HISTORY_ARGS == 6
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& /*skip_actions*/) override {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory);
  }
#elif EXPANSE_TORCH_RECORD_HISTORY_ARGS == 5
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clearHistory) override {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory);
  }
#else
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when) override {
    // Before clear_history existed, enabling again kept the trace too.
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, false);
  }
#endif

#if EXPANSE_TORCH_HAS_CONTEXT_FOR_POINTER
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    std::lock_guard<std::mutex> lock(history_mu_);
    auto it = contexts_.find(const_cast<void*>(ptr));
    return it == contexts_.end() ? nullptr : it->second;
  }
#endif

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    oom_observers_.push_back(std::move(observer));
  }

#if EXPANSE_TORCH_HAS_OOM_REJECTION_OBSERVER
  // expanse never rejects an allocation ahead of trying it, so these are never called.
  void attachOomRejectionObserver(cca::OomRejectionObserver) override {}
#endif

  // Trackers see this allocator's alloc / free_requested / free_completed entries (expanse
  // frees at once in stream order: the two free entries come together); segment map and unmap
  // happen inside expanse and are in its history (recordHistory) only.
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    trackers_.push_back(std::move(tracker));
    have_trackers_.store(true);
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    // Memory of cudaMalloc (other libraries) needs the runtime's grant; expanse's VMM memory
    // needs its own (cudaDeviceEnablePeerAccess does not cover it).
    {
      c10::cuda::CUDAGuard guard(dev);
      const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        C10_CUDA_CHECK(err);
      }
    }
    check(expanse_enable_peer_access(dev_to_access, dev), "expanse_enable_peer_access");
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // Without peer access, VMM memory of another device is reachable only by the peer copy.
    if (p2p_enabled || dstDevice == srcDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::string name() override { return "expanse"; }

  void free_from_deleter(Allocation* a) noexcept {
    if (have_trackers_.load(std::memory_order_relaxed)) track_free(*a);
    free_allocation(*a);
    delete a;
  }

 private:
  void* malloc_or_throw(size_t n, c10::DeviceIndex dev, cudaStream_t stream) {
    void* p = nullptr;
    const int rc = expanse_malloc_checked(&p, n, dev, reinterpret_cast<CUstream_st*>(stream));
    if (rc == EXPANSE_OK) return p;
    const std::string why = expanse_last_error();  // copied before any other expanse call
    if (rc != EXPANSE_ENOMEM) {
      TORCH_CHECK(false, "expanse: allocating ", ta::format_size(n), " on CUDA device ",
                  static_cast<int>(dev), " failed: ", why);
    }
    // Pools marked use_on_oom (MemPool(use_on_oom=True)), newest first: their cached memory.
    for (expanse_pool_id id : pools_.use_on_oom(dev)) {
      if (void* q = expanse_pool_malloc(id, n, reinterpret_cast<CUstream_st*>(stream))) return q;
    }
    expanse_stats s{};
    if (ta::read_stats(dev, s) != EXPANSE_OK) std::memset(&s, 0, sizeof s);
    notify_oom(dev, n, s);
    // c10::OutOfMemoryError: Python sees torch.cuda.OutOfMemoryError.
    TORCH_CHECK_WITH(OutOfMemoryError, false, ta::oom_message(n, dev, s, why));
  }

  // Frees a block that allocate_on / raw_alloc_on got but cannot hand out (what failed after
  // expanse allocated it), with the context recorded for it if any; trace trackers that saw its
  // alloc see no free (they are not called again while an error is on its way out).
  void give_back(void* p, c10::DeviceIndex dev, cudaStream_t stream) noexcept {
    free_allocation(Allocation{p, stream, static_cast<int>(dev), 0});
  }

  void notify_oom(c10::DeviceIndex dev, size_t requested, const expanse_stats& s) {
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mu_);
      observers = oom_observers_;
    }
    const ta::OomObserverArgs a = ta::oom_observer_args(requested, s);
    for (auto& o : observers) {
      o(dev, static_cast<size_t>(a.alloc_size), static_cast<size_t>(a.device_total),
        static_cast<size_t>(a.device_free));
    }
  }

  void after_alloc(void* p, size_t n, c10::DeviceIndex dev, cudaStream_t stream) {
    if (history_contexts_.load(std::memory_order_relaxed)) {
      cca::CreateContextFn recorder = nullptr;
      {
        std::lock_guard<std::mutex> lock(history_mu_);
        recorder = context_recorder_;
      }
      if (recorder != nullptr) {
        auto ctx = recorder();
        std::lock_guard<std::mutex> lock(history_mu_);
        contexts_[p] = std::move(ctx);
      }
    }
    if (have_trackers_.load(std::memory_order_relaxed)) {
      track(TraceT::ALLOC, dev, p, n, stream);
    }
  }

  void track_free(const Allocation& a) {
    const auto dev = static_cast<c10::DeviceIndex>(a.device);
    track(TraceT::FREE_REQUESTED, dev, a.ptr, a.size, a.stream);
    track(TraceT::FREE_COMPLETED, dev, a.ptr, a.size, a.stream);
  }

  void track(typename TraceT::Action action, c10::DeviceIndex dev, void* p, size_t n,
             cudaStream_t stream) {
    std::vector<cca::AllocatorTraceTracker> trackers;
    {
      std::lock_guard<std::mutex> lock(observers_mu_);
      trackers = trackers_;
    }
    const TraceT e = trace_entry(action, dev, reinterpret_cast<uint64_t>(p), n,
                                 reinterpret_cast<uint64_t>(stream), 0);
    for (auto& t : trackers) t(e);
  }

  static TraceT trace_entry(typename TraceT::Action action, c10::DeviceIndex dev, uint64_t addr,
                            uint64_t size, uint64_t stream, int64_t time_us) {
#if EXPANSE_TORCH_TRACE_ENTRY_HAS_POOL
    TraceT e(action, dev, static_cast<size_t>(addr), static_cast<size_t>(size),
             reinterpret_cast<decltype(TraceT::stream_)>(stream), MempoolId{0, 0},
             c10::approx_time_t{});
#else
    TraceT e(action, dev, static_cast<size_t>(addr), static_cast<size_t>(size),
             reinterpret_cast<decltype(TraceT::stream_)>(stream), c10::approx_time_t{});
#endif
    // Snapshots carry microseconds since the epoch in time_.t_ (PyTorch converts its own clock
    // readings to that when it takes a snapshot); expanse records that already.
    e.time_.t_ = static_cast<time_t>(time_us);
    return e;
  }

  static typename TraceT::Action trace_action(uint32_t a) {
    switch (a) {
      case EXPANSE_TRACE_ALLOC: return TraceT::ALLOC;
      case EXPANSE_TRACE_FREE_REQUESTED: return TraceT::FREE_REQUESTED;
      case EXPANSE_TRACE_FREE_COMPLETED: return TraceT::FREE_COMPLETED;
      case EXPANSE_TRACE_SEGMENT_MAP: return TraceT::SEGMENT_MAP;
      case EXPANSE_TRACE_SEGMENT_UNMAP: return TraceT::SEGMENT_UNMAP;
      default: return TraceT::OOM;
    }
  }

  // As PyTorch's allocator: enabling while recording keeps the trace unless clear is set.
  // expanse_record_history(1, ...) starts a new trace, so it is called only to start recording,
  // to clear, or for a new max_entries (expanse cannot change the bound of a trace it keeps: the
  // trace then restarts). Disabling stops recording and keeps the trace, which PyTorch drops.
  void record_history(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                      cca::RecordContext when, bool clear) {
    std::lock_guard<std::mutex> lock(history_mu_);
    const bool keep = enabled && !clear && history_on_.load() && max_entries == history_max_;
    if (!keep) {
      check(expanse_record_history(enabled ? 1 : 0, max_entries), "expanse_record_history");
    }
    history_max_ = max_entries;
    const bool contexts = enabled && recorder != nullptr && when != cca::RecordContext::NEVER;
    context_recorder_ = contexts ? recorder : nullptr;
    if (!contexts) contexts_.clear();
    history_contexts_.store(contexts);
    history_on_.store(enabled);
  }

  SnapshotT make_snapshot(bool include_traces) {
    SnapshotT out{};
    const int n = expanse_device_count();
    TORCH_CHECK(n >= 0, "expanse: snapshot: ", expanse_last_error());
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts;
    if (history_contexts_.load()) {
      std::lock_guard<std::mutex> lock(history_mu_);
      contexts = contexts_;
    }
    for (int d = 0; d < n; ++d) {
      const ta::Segments segs = segments_of(d);
      for (const expanse_segment_info& s : segs.segments) {
        SegmentT seg;
        seg.device = static_cast<c10::DeviceIndex>(d);
        seg.address = static_cast<size_t>(s.address);
        seg.total_size = static_cast<size_t>(s.size);
        seg.stream = nullptr;  // one VA range per arena, shared by every stream
        seg.is_large = s.small_arena == 0;
        seg.is_expandable = true;
        const uint64_t end = std::min<uint64_t>(s.first_block + s.num_blocks, segs.blocks.size());
        for (uint64_t i = s.first_block; i < end; ++i) {
          const expanse_block_info& b = segs.blocks[i];
          BlockT blk;
          blk.size = static_cast<size_t>(b.size);
          // A block awaiting other streams is inactive: its trace records free_completed at
          // the free already, and PyTorch's active_pending_free says that is still to come
          // (see write_segment in src/api/history.cpp).
          blk.allocated = b.state == EXPANSE_BLOCK_LIVE;
          blk.active = blk.allocated;
          blk.requested_size = static_cast<size_t>(blk.allocated ? b.requested : 0);
          if (blk.allocated) {
            auto it = contexts.find(reinterpret_cast<void*>(b.address));
            if (it != contexts.end()) blk.context_when_allocated = it->second;
            seg.allocated_size += blk.size;
            seg.requested_size += blk.requested_size;
          }
          if (blk.active) seg.active_size += blk.size;
          seg.blocks.push_back(std::move(blk));
        }
        out.segments.push_back(std::move(seg));
      }
    }
    if (include_traces) {
      out.device_traces.resize(static_cast<size_t>(n));
      std::vector<expanse_trace_entry> t;
      for (int d = 0; d < n; ++d) {
        check(ta::read_trace(d, t), "expanse_get_trace");
        for (const expanse_trace_entry& e : t) {
          out.device_traces[static_cast<size_t>(d)].push_back(trace_entry(
              trace_action(e.action), static_cast<c10::DeviceIndex>(d), e.addr, e.size, e.stream,
              e.time_us));
        }
      }
    }
    out.config_metadata.expandable_segments = true;
    out.config_metadata.max_split_size = SIZE_MAX;  // expanse never limits splitting
    return out;
  }

  void release_all() {
    const int n = expanse_device_count();
    TORCH_CHECK(n >= 0, "expanse: empty_cache: ", expanse_last_error());
    for (int d = 0; d < n; ++d) check(expanse_release_cached(d), "expanse_release_cached");
    pools_.forget_finished();  // released pools whose memory went back just now
  }

  // MemPool(allocator=...) asks PyTorch's allocator to take the pool's segments from another
  // allocator; expanse takes a pool's memory from expanse only.
  void check_pool_allocator(const cca::CUDAAllocator* allocator) const {
    TORCH_CHECK(allocator == nullptr || allocator == this,
                "expanse: torch.cuda.MemPool(allocator=...) with an allocator of its own is not "
                "supported by expanse's native allocator (a pool's memory comes from expanse); "
                "use torch.cuda.MemPool() without an allocator");
  }

  [[noreturn]] static void no_pool_snapshot(const MempoolId& id) {
    TORCH_CHECK(false, "expanse: a snapshot of one memory pool (", id.first, ", ", id.second,
                ") is not available: expanse's segments are shared by its pools and its "
                "snapshot records do not say which pool a block belongs to. "
                "torch.cuda.memory_snapshot() (no pool) shows every segment, pools' blocks "
                "included");
  }

  ta::Baseline& baseline(c10::DeviceIndex device) {  // books_mu_ held
    const size_t d = static_cast<size_t>(device);
    if (d >= baselines_.size()) baselines_.resize(d + 1);
    return baselines_[d];
  }

  std::atomic<bool> initialized_{false};

  std::mutex raw_mu_;
  std::unordered_map<void*, Allocation> raw_;

  std::mutex books_mu_;
  std::vector<ta::Baseline> baselines_;

  ta::PoolMap pools_;

  std::mutex history_mu_;
  std::atomic<bool> history_on_{false};
  std::atomic<bool> history_contexts_{false};
  size_t history_max_ = 0;  // the max_entries expanse's trace was started with
  cca::CreateContextFn context_recorder_ = nullptr;
  std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;

  std::mutex observers_mu_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  std::atomic<bool> have_trackers_{false};
};

void delete_allocation(void* ctx) {
  if (ctx == nullptr) return;  // a zero-size allocation
  g_installed->free_from_deleter(static_cast<Allocation*>(ctx));
}

}  // namespace
}  // namespace expanse::torch_native

// ---- what Python calls (ctypes) ------------------------------------------------------------
// Left out where the class is exercised without libtorch_cuda (test/torch_adapter's
// torch_native_smoke, which links only c10): installing needs changeCurrentAllocator.
#ifndef EXPANSE_TORCH_NATIVE_WITHOUT_INSTALL
namespace expanse::torch_native {
namespace {
thread_local std::string g_install_error;
}  // namespace
}  // namespace expanse::torch_native

extern "C" {

// Makes expanse PyTorch's CUDA allocator. 0 on success; otherwise the reason is in
// expanse_torch_native_error(). Must run before PyTorch initializes CUDA.
__attribute__((visibility("default"))) int expanse_torch_native_install(void) {
  using namespace expanse::torch_native;
  try {
    if (g_installed != nullptr) return 0;
    // Never destroyed: tensors freed during interpreter exit still reach it. The shared_ptr that
    // PyTorch keeps gets a no-op deleter for that reason.
    auto* a = new ExpanseAllocator();
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> p(a, [](void*) {});
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(p);
    g_installed = a;
    return 0;
  } catch (const std::exception& e) {
    g_install_error = e.what();
  } catch (...) {
    g_install_error = "unknown error";
  }
  return 1;
}

__attribute__((visibility("default"))) const char* expanse_torch_native_error(void) {
  return expanse::torch_native::g_install_error.c_str();
}

__attribute__((visibility("default"))) int expanse_torch_native_installed(void) {
  return expanse::torch_native::g_installed != nullptr ? 1 : 0;
}

}  // extern "C"
#endif  // EXPANSE_TORCH_NATIVE_WITHOUT_INSTALL
