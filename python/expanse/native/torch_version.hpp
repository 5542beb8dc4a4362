// What differs between the PyTorch versions expanse's native allocator builds against (2.6 to the
// newest): every version test of torch_allocator.cpp is made here, from torch/version.h, and named
// by what it selects.
//
// Read from the headers of torch 2.6, 2.8, 2.11, 2.13 and 2.15 (the source compiles against each:
// -DEXPANSE_TORCH_INCLUDE, test/torch_compile_check.sh). A change that happened in a version
// between two of those (2.7, 2.9, 2.10, 2.12, 2.14) is placed at the later checked one unless
// noted; a version placed wrongly fails to compile, and expanse.torch.use() then falls back to
// the pluggable allocator naming the compiler's error.
#pragma once

#include <torch/version.h>

#define EXPANSE_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

#if EXPANSE_TORCH_VERSION < 206
#error "expanse's native allocator needs PyTorch 2.6 or newer; use expanse.torch.use(native=False)"
#endif

// c10::DeviceAllocator (initialized, emptyCache(MempoolId_t), getDeviceStats, ...) is
// CUDAAllocator's base from 2.8; in 2.6 CUDAAllocator declares them itself and emptyCache takes
// no pool.
#define EXPANSE_TORCH_EMPTY_CACHE_TAKES_POOL (EXPANSE_TORCH_VERSION >= 208)

// snapshot(): no arguments in 2.6, (MempoolId_t) in 2.8, (MempoolId_t, bool include_traces) in
// 2.11 (placed at 2.10).
#define EXPANSE_TORCH_SNAPSHOT_ARGS \
  (EXPANSE_TORCH_VERSION >= 210 ? 2 : EXPANSE_TORCH_VERSION >= 208 ? 1 : 0)

// recordHistory(enabled, recorder, max_entries, when): + bool clearHistory in 2.8 (placed at
// 2.7), + skip_actions in 2.11 (placed at 2.10).
#define EXPANSE_TORCH_RECORD_HISTORY_ARGS \
  (EXPANSE_TORCH_VERSION >= 210 ? 6 : EXPANSE_TORCH_VERSION >= 207 ? 5 : 4)

// TraceEntry's constructor takes the trace's MempoolId_t (before the time) in 2.8, not in 2.6
// (placed at 2.7).
#define EXPANSE_TORCH_TRACE_ENTRY_HAS_POOL (EXPANSE_TORCH_VERSION >= 207)

// The pool hook MemPool calls: 0 = ensureExistsAndIncrefPool(device, id) (2.6),
// 1 = createOrIncrefPool(device, id, CUDAAllocator*) (2.8),
// 2 = createOrIncrefPool(device, id, std::shared_ptr<CUDAAllocator>) (2.11).
#define EXPANSE_TORCH_POOL_INCREF_FORM \
  (EXPANSE_TORCH_VERSION >= 211 ? 2 : EXPANSE_TORCH_VERSION >= 208 ? 1 : 0)

// setUseOnOOM / setNoSplit (MemPool options): in 2.11, not in 2.8 (placed at 2.9).
#define EXPANSE_TORCH_HAS_POOL_OPTIONS (EXPANSE_TORCH_VERSION >= 209)

// getExpandableSegmentSizes (a pure virtual): in 2.11, not in 2.8 (placed at 2.10).
#define EXPANSE_TORCH_HAS_GET_EXPANDABLE_SEGMENT_SIZES (EXPANSE_TORCH_VERSION >= 210)

// attachOomRejectionObserver (a pure virtual) and getContextForPointer (a virtual with a
// default): in 2.13, not in 2.11.
#define EXPANSE_TORCH_HAS_OOM_REJECTION_OBSERVER (EXPANSE_TORCH_VERSION >= 213)
#define EXPANSE_TORCH_HAS_CONTEXT_FOR_POINTER (EXPANSE_TORCH_VERSION >= 213)

// at::HostAllocator and its registry (at::setHostAllocator / getHostAllocator, which pinned
// allocations, record_event and the host stats all go through): from 2.8.
#define EXPANSE_TORCH_HAS_HOST_ALLOCATOR (EXPANSE_TORCH_VERSION >= 208)

// HostAllocator::begin_allocate_to_pool / end_allocate_to_pool / release_pool (CUDA graphs'
// pinned memory; the base throws "not implemented", and CUDAGraph calls them at every capture):
// in 2.11, not in 2.8 (placed at 2.10).
#define EXPANSE_TORCH_HOST_ALLOCATOR_HAS_POOLS (EXPANSE_TORCH_VERSION >= 210)
