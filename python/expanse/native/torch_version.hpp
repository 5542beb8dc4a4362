// What differs between the PyTorch versions expanse's native allocator builds against (2.6 to the
// newest): every version test of torch_allocator.cpp is made here, from torch/version.h, and named
// by what it selects. Checked against the headers of the versions test/torch_compile_check.sh
// compiles (docs/integrations.md lists them); the others follow PyTorch's release notes and may
// need a line here.
#pragma once

#include <torch/version.h>

#define EXPANSE_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

#if EXPANSE_TORCH_VERSION < 206
#error "expanse's native allocator needs PyTorch 2.6 or newer; use expanse.torch.use(native=False)"
#endif

// c10::DeviceAllocator (initialized, emptyCache(MempoolId_t), getDeviceStats, ...) became
// CUDAAllocator's base in 2.8; before, CUDAAllocator declared them itself and emptyCache took no
// pool.
#define EXPANSE_TORCH_EMPTY_CACHE_TAKES_POOL (EXPANSE_TORCH_VERSION >= 208)

// snapshot(MempoolId_t, bool include_traces) since 2.10 (2.8/2.9: snapshot(MempoolId_t); before:
// snapshot()).
#define EXPANSE_TORCH_SNAPSHOT_ARGS (EXPANSE_TORCH_VERSION >= 210 ? 2 : EXPANSE_TORCH_VERSION >= 208 ? 1 : 0)

// recordHistory(..., bool clearHistory, const std::vector<std::string>& skip_actions) since 2.10
// (2.7..2.9: clearHistory only; 2.6: neither).
#define EXPANSE_TORCH_RECORD_HISTORY_ARGS (EXPANSE_TORCH_VERSION >= 210 ? 6 : EXPANSE_TORCH_VERSION >= 207 ? 5 : 4)

// TraceEntry's constructor takes the trace's MempoolId_t (before the time) since 2.7.
#define EXPANSE_TORCH_TRACE_ENTRY_HAS_POOL (EXPANSE_TORCH_VERSION >= 207)

// The pool hook MemPool calls: 0 = ensureExistsAndIncrefPool(device, id) (before 2.8),
// 1 = createOrIncrefPool(device, id, CUDAAllocator*) (2.8; 2.9 and 2.10 unchecked),
// 2 = createOrIncrefPool(device, id, std::shared_ptr<CUDAAllocator>) (2.11 on).
#define EXPANSE_TORCH_POOL_INCREF_FORM (EXPANSE_TORCH_VERSION >= 211 ? 2 : EXPANSE_TORCH_VERSION >= 208 ? 1 : 0)

// setUseOnOOM / setNoSplit (MemPool options) since 2.9.
#define EXPANSE_TORCH_HAS_POOL_OPTIONS (EXPANSE_TORCH_VERSION >= 209)

// getExpandableSegmentSizes (a pure virtual) since 2.10.
#define EXPANSE_TORCH_HAS_GET_EXPANDABLE_SEGMENT_SIZES (EXPANSE_TORCH_VERSION >= 210)

// attachOomRejectionObserver (a pure virtual) since 2.13 (2.12 unchecked).
#define EXPANSE_TORCH_HAS_OOM_REJECTION_OBSERVER (EXPANSE_TORCH_VERSION >= 213)

// getContextForPointer (a virtual with a default) since 2.15.
#define EXPANSE_TORCH_HAS_CONTEXT_FOR_POINTER (EXPANSE_TORCH_VERSION >= 215)
