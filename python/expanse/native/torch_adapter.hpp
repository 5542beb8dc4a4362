// The torch-free half of expanse's native PyTorch allocator (torch_allocator.cpp): what PyTorch's
// CUDAAllocator asks, answered from expanse's public C API (expanse/expanse.h) in plain types, so
// that it builds and is tested (test/torch_adapter) without PyTorch. torch_allocator.cpp only
// copies these answers into c10's types.
//
// Only the C ABI is used: the extension is compiled with the flags of the user's torch
// (_GLIBCXX_USE_CXX11_ABI among them), which may differ from libexpanse's, so no std:: type
// crosses into libexpanse.
#pragma once

#include "expanse/expanse.h"

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace expanse::torch_adapter {

// c10::CachingAllocator::Stat, field for field.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
};

// c10's StatType order: AGGREGATE, SMALL_POOL, LARGE_POOL.
enum Pool : size_t { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kNumPools = 3 };
using StatArray = std::array<Stat, kNumPools>;

// c10::CachingDeviceAllocator::DeviceStats, less the private-pool map.
// How each figure comes from expanse's books: map_device_stats (torch_adapter.cpp) and
// docs/integrations.md.
struct DeviceStats {
  StatArray allocation;
  StatArray segment;
  StatArray active;
  StatArray inactive_split;
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  Stat oversize_allocations;
  Stat oversize_segments;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t max_split_size = -1;  // PyTorch's "no limit" as memory_stats() shows it
};

// One device's segments and blocks (expanse_get_segments), in expanse's order.
struct Segments {
  std::vector<expanse_segment_info> segments;
  std::vector<expanse_block_info> blocks;
};

// Reads the segments of device, growing the arrays until the books fit. Returns an expanse
// error code (expanse_last_error() says why).
int read_segments(int device, Segments& out);
// Reads the recorded history of device (expanse_get_trace), likewise.
int read_trace(int device, std::vector<expanse_trace_entry>& out);

// Per-segment sums: what DeviceStats's current values are made of, per pool.
struct PoolFigures {
  int64_t segments = 0, segment_bytes = 0;
  int64_t live_blocks = 0, live_bytes = 0, requested_bytes = 0;
  int64_t awaiting_blocks = 0, awaiting_bytes = 0;
  int64_t free_blocks = 0, free_bytes = 0;
};
std::array<PoolFigures, kNumPools> pool_figures(const Segments& segs);

// What expanse keeps no running total or peak of, kept here per device: the counters at the last
// resetAccumulatedStats (PyTorch's accumulated figures are counted from there) and the highest
// current values seen by reads since the last resetPeakStats (expanse keeps exact peaks of the
// aggregate allocated, requested and physical bytes only).
struct Baseline {
  uint64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  uint64_t created_pages = 0, released_pages = 0, syncs = 0;
  std::array<StatArray, 9> seen_peaks{};  // indexed like the StatArrays of DeviceStats, in order
  // The last setMemoryFraction and the limit it became (fraction < 0: none).
  double fraction = -1;
  uint64_t fraction_limit = 0;
};

// The number of context synchronizations expanse made (driver_calls of cuCtxSynchronize): the
// closest it has to PyTorch's synchronize-all-streams count.
uint64_t context_syncs(const expanse_stats& s);

// DeviceStats from expanse's stats and segments. Updates b.seen_peaks.
DeviceStats map_device_stats(const expanse_stats& s, const Segments& segs, Baseline& b);
// The Baseline that makes every accumulated figure 0 from now on (peaks kept).
void reset_accumulated(const expanse_stats& s, Baseline& b);
// Forgets the seen peaks (expanse_reset_peak_stats resets expanse's own).
void reset_seen_peaks(Baseline& b);

// cacheInfo's answer: the largest single block expanse could hand out now. Free memory the
// driver reports (device_free; pass UINT64_MAX when unknown to use capacity - physical) plus what
// expanse holds unused (cached mapped pages and pooled unmapped ones: expanse remaps pages, so
// its unused memory serves one contiguous request), within the limit (expanse_set_limit) on
// pages touched by live blocks; whole pages only.
uint64_t largest_block(const expanse_stats& s, uint64_t device_free);

// The fraction setMemoryFraction sets, as expanse_set_limit's bytes (whole pages, rounded down;
// fraction 1 removes the cap), and the fraction getMemoryFraction answers from the limit.
uint64_t limit_for_fraction(const expanse_stats& s, double fraction);
double fraction_of_limit(const expanse_stats& s);
// getMemoryFraction's answer: the fraction last set, while the limit is still the one it became
// (PyTorch answers the fraction it was given), else fraction_of_limit.
void remember_fraction(Baseline& b, double fraction, uint64_t limit);
double memory_fraction(const expanse_stats& s, const Baseline& b);

// PyTorch's size format in its OOM messages: "512 bytes", "2.00 KiB", "20.00 MiB", "1.50 GiB".
std::string format_size(uint64_t bytes);
// The message of the c10::OutOfMemoryError an allocation of `requested` bytes that expanse
// refused raises: PyTorch's start ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a
// total capacity of ..."), the figures from expanse's stats, then expanse's own explanation
// (expanse_last_error at the failure); expanse_format_oom's, the pluggable pair's message.
std::string oom_message(uint64_t requested, int device, const expanse_stats& s,
                        const std::string& expanse_error);

// What OutOfMemoryObservers are called with after an allocation of `requested` bytes failed, as
// PyTorch's allocator calls them (device, alloc_size, device_total, device_free): the request, the
// device's memory (the limit where one is below it) and what of that live blocks leave free.
struct OomObserverArgs {
  uint64_t alloc_size = 0;
  uint64_t device_total = 0;
  uint64_t device_free = 0;
};
OomObserverArgs oom_observer_args(uint64_t requested, const expanse_stats& s);

// expanse_get_stats with struct_size set; an expanse error code.
int read_stats(int device, expanse_stats& out);

// ---- memory pools (CUDA graphs, torch.cuda.MemPool) ------------------------------------------
// PyTorch names a private pool by a pair of numbers (c10::MempoolId_t: {graph uuid, 0} for a
// graph's own pool or graph_pool_handle(), {0, uid} for a MemPool) and keeps one pool per device
// for each. Each becomes one expanse pool (expanse_pool_create), found by (device, pair).

struct MempoolKey {
  int device = 0;
  uint64_t first = 0, second = 0;
  bool operator<(const MempoolKey& o) const {
    return device != o.device ? device < o.device : first != o.first ? first < o.first
                                                                       : second < o.second;
  }
};
// "memory pool (1, 0) on device 0": how errors name a pool.
std::string pool_name(const MempoolKey& k);

// What the pool functions throw; the torch half raises it as a c10::Error with this message.
struct PoolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// PyTorch's allocation filters (std::function<bool(cudaStream_t)>; cudaStream_t is CUstream_st*)
// behind expanse_pool_begin_filter's C filter. The ctx expanse keeps is not a pointer to the copy
// but a slot number and generation (a slot is never freed; it is reused after its route ended):
// expanse calls filters outside its locks, so a call may still arrive for a route ended a moment
// before, and it then finds a newer generation and answers "no". remove() waits for the calls in
// flight before destroying the copy, so a filter never runs once its route's end returned (as in
// PyTorch, whose allocator runs filters under the lock endAllocateToPool takes).
class FilterTable {
 public:
  using Filter = std::function<bool(CUstream_st*)>;
  // The process's table (the trampoline is a plain function: it finds no other).
  static FilterTable& instance();
  // Keeps a copy of f; returns the ctx to give expanse_pool_begin_filter with trampoline.
  void* add(Filter f);
  // Ends ctx (from add): later calls answer 0; waits for calls in flight, destroys the copy.
  void remove(void* ctx);
  // expanse_pool_begin_filter's filter.
  static int trampoline(CUstream_st* stream, void* ctx);
  // Filters held (added and not removed): for tests.
  size_t held() const;

 private:
  struct Slot {
    uint32_t generation = 1;
    int in_flight = 0;
    bool used = false;
    Filter filter;
  };
  int call(CUstream_st* stream, void* ctx);
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::deque<Slot> slots_;  // never shrinks: a slot's address stays valid
  std::vector<uint32_t> free_;
  size_t held_ = 0;
};

// The pools this allocator made, with PyTorch's semantics (c10's DeviceCachingAllocator):
//   begin (beginAllocateToPool): create the pool with use count 1, or retain it
//     (create_or_incref), then route the allocations on its device whose stream the filter
//     accepts to it. One routing per pool at a time.
//   end (endAllocateToPool): stop that routing; the use count is unchanged.
//   release (releasePool): use count - 1; at 0 expanse releases the pool (its memory goes back
//     once expanse proves the work that used it done).
//   create_or_incref (createOrIncrefPool / ensureExistsAndIncrefPool: torch.cuda.MemPool).
// A pool whose use count reached 0 cannot be begun or retained again (PyTorch asserts), unless
// expanse has given all its memory back and none of its blocks is live: PyTorch has then forgotten
// the pool (torch.cuda.graph calls empty_cache() before each capture), and the pair names a new
// one; so does this map. Every error is a PoolError naming the pool, and changes nothing.
class PoolMap {
 public:
  using Filter = FilterTable::Filter;
  PoolMap() = default;
  // Ends the routings still on (their filters are destroyed); the pools keep their use counts.
  ~PoolMap();
  PoolMap(const PoolMap&) = delete;
  PoolMap& operator=(const PoolMap&) = delete;
  void begin(const MempoolKey& k, Filter filter);
  void end(const MempoolKey& k);
  void release(const MempoolKey& k);
  void create_or_incref(const MempoolKey& k);
  // The use count (0 for a pair never created, as PyTorch's other allocators answer).
  int use_count(const MempoolKey& k);
  // The expanse pool of k; 0 when none.
  expanse_pool_id id_of(const MempoolKey& k) const;
  // emptyCache(pair): the released pools of that pair (on any device) give their cached memory
  // back (expanse_pool_trim; during an announced capture nothing is given back, and a later
  // empty_cache does it); a live pool keeps its memory, as PyTorch's does.
  void empty_cache(uint64_t first, uint64_t second);
  // Forgets the pools expanse has nothing of any more (released, returned, no live block).
  void forget_finished();
  // checkPoolLiveAllocations: whether the live blocks of k's pool are exactly `expected`.
  bool live_allocations_are(const MempoolKey& k, const std::unordered_set<void*>& expected) const;
  // setUseOnOOM: an allocation on k.device that fails for lack of memory is tried again in the
  // pools marked so (their cached memory), newest mark first.
  void set_use_on_oom(const MempoolKey& k, bool use);
  std::vector<expanse_pool_id> use_on_oom(int device) const;
  // Pairs known (for tests).
  size_t size() const;

 private:
  struct Entry {
    expanse_pool_id id = 0;
    void* filter_ctx = nullptr;  // while routing
    bool routing = false;
    bool use_on_oom = false;
    uint64_t oom_order = 0;
  };
  // Creates k's pool, or retains it (PoolError naming `what` when it cannot be begun again).
  Entry& acquire(const MempoolKey& k, const char* what, bool* created);  // mu_ held
  mutable std::mutex mu_;
  std::map<MempoolKey, Entry> pools_;
  uint64_t next_oom_order_ = 1;
};

}  // namespace expanse::torch_adapter
