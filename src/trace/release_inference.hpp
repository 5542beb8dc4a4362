// Finds in a PyTorch snapshot the releases of cached memory that its trace does not mark, so that
// a replay can make them too: a torch.cuda.empty_cache() call, and the caching allocator's
// free-and-retry (cudaMalloc failed, so it released its cached segments and tried again). Both
// show only as segment_free events with no free of a block behind them; PyTorch's allocator
// releases a segment at no other time (garbage collection aside, which needs a memory fraction).
//
// The rules, over the recorded segment events between two operations of the trace:
// - a run of segment_free events followed, before the next operation, by the segment_alloc that
//   serves that operation's allocation (its block lies in the new segment) is a free-and-retry
//   when the request would have brought the reserved memory past the highest it had reached
//   before (so the device may well have refused it), when none of the released segments would
//   have served it from the cache (PyTorch looks there before it calls cudaMalloc), and when no
//   freed segment's recorded stack names empty_cache; otherwise it is an empty_cache() call
//   followed by that allocation;
// - a run followed by the recording's oom record is the free-and-retry of an allocation that
//   failed anyway (the allocation is not in the trace);
// - any other run is an empty_cache() call.
// "Past the highest" assumes the memory other processes held did not grow meanwhile. An
// empty_cache() called right before an allocation that no released segment could serve and that
// grows the reserved memory to a new peak looks like a free-and-retry unless the snapshot
// recorded stacks (_record_memory_history(context="all")): such a call is counted as a
// free-and-retry. In the models of PyTorch's allocator both then release the same segments (the
// cache could not serve the allocation, so the retry releases what empty_cache() released); with
// max_split_size the retry releases the oversize ones first, so only their order may differ.
//
// Recordings with expandable segments (segment_map / segment_unmap) are left alone: their
// releases unmap pages and the models do not start from their recorded state.
#pragma once

#include "trace/trace.hpp"

namespace expanse::trace {

// Fills t.releases from t.torch's segment events (nothing for a trace without them).
void infer_releases(Trace& t);

}  // namespace expanse::trace
