// What PyTorch's own caching allocator did while a snapshot was recorded: its segment events,
// its segments at the end, the blocks live before recording began, its recorded OOMs and its
// settings. Read with the snapshot (load_snapshot); used to start the models of
// models/torch_caching_model.hpp from the state at the beginning of recording and to check them.
#pragma once

#include "trace/torch_settings.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace expanse::trace {

struct TorchRecording {
  struct SegmentEvent {
    std::string action;  // segment_alloc, segment_free, segment_map, segment_unmap
    uint64_t op = 0;     // index into Trace::ops of the next alloc / free recorded after it
    uint64_t addr = 0;
    uint64_t size = 0;
    uint64_t stream = 0;
    uint64_t seq = 0;  // position among the device's recorded events (orders it against ooms)
    // Its recorded stack names torch.cuda.empty_cache() (stacks are recorded with
    // _record_memory_history(context="all")): the one mark a snapshot gives such a call.
    bool in_empty_cache = false;
  };
  struct Block {
    uint64_t addr = 0;
    uint64_t size = 0;
    bool allocated = false;  // state active_allocated
  };
  struct Segment {
    uint64_t addr = 0;
    uint64_t size = 0;
    uint64_t stream = 0;
    bool small = false;         // segment_type "small" (else large)
    bool expandable = false;    // is_expandable
    bool private_pool = false;  // segment_pool_id other than (0, 0): a CUDA graph pool
    std::vector<Block> blocks;
  };
  struct Preexisting {
    uint32_t block = 0;  // Trace block id
    uint64_t addr = 0;
    uint64_t size = 0;  // block size (live at the end) or requested size (freed in the trace)
    bool live_at_end = false;
  };
  struct Oom {
    uint64_t op = 0;  // as SegmentEvent::op
    uint64_t size = 0;
    uint64_t device_free = 0;
    uint64_t seq = 0;  // as SegmentEvent::seq
    uint64_t stream = 0;
  };

  std::vector<SegmentEvent> events;
  std::vector<Segment> end_segments;  // the snapshot's segments of the device replayed
  std::vector<Preexisting> preexisting;
  std::vector<uint64_t> block_addr;  // each Trace block's address, by block id
  std::vector<Oom> ooms;
  std::optional<TorchSettings> settings;  // from allocator_settings, when recorded
  std::string settings_error;             // why allocator_settings could not be used
};

}  // namespace expanse::trace
