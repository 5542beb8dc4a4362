// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), written from
// its documented rules and shared with nothing in expanse's own allocator:
// - requests rounded to 512 B (or by roundup_power2_divisions); <= 1 MiB from the small pool,
//   cut from 2 MiB segments; larger ones from the large pool, where requests under 10 MiB cut
//   20 MiB segments and bigger ones get their own, rounded to 2 MiB;
// - best fit per stream and pool (smallest block >= the request, lowest address on ties);
//   blocks >= max_split_size serve only requests >= max_split_size and at most
//   max_non_split_rounding smaller than themselves;
// - a block is split when the rest is >= 512 B (small pool) or > 1 MiB (large pool, request
//   under max_split_size); freed blocks merge with free neighbours of their segment;
// - when nothing cached fits: garbage collection (with a memory fraction), cudaMalloc, then free
//   oversize cached blocks and retry, then free every unsplit cached segment and retry, then OOM;
// - with expandable_segments:True one growing segment per stream and pool, mapped and unmapped
//   a page at a time (TorchExpandableSegment), any rest >= 512 B split off.
// Not modelled: cross-stream uses (record_stream and its events), CUDA graph private pools,
// IPC, other threads' concurrent frees, and memory other processes hold.
#pragma once

#include "models/device_memory.hpp"
#include "models/driver_tally.hpp"
#include "models/torch_expandable_segment.hpp"
#include "trace/torch_settings.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace expanse::replay {

// What the model did to the device, in PyTorch's snapshot vocabulary.
struct TorchSegmentEvent {
  enum class Kind : uint8_t { segment_alloc, segment_free, segment_map, segment_unmap };
  Kind kind = Kind::segment_alloc;
  uint64_t op = 0;  // the operation during which it happened (set_op)
  uint64_t addr = 0;
  uint64_t size = 0;
};
const char* segment_event_name(TorchSegmentEvent::Kind k) noexcept;

// The moment an allocation failed: what the device and the allocator held then.
struct TorchOom {
  uint64_t op = 0;
  uint64_t request = 0;             // bytes asked for (the trace's size)
  uint64_t rounded = 0;             // after rounding
  uint64_t reserved = 0;            // the allocator's segments (or mapped pages)
  uint64_t allocated = 0;           // in live blocks
  uint64_t device_free = 0;         // capacity - reserved
  uint64_t largest_free_block = 0;  // largest cached free block after the release-and-retry
  // Fragmentation: capacity - allocated would hold the request, but no block or new segment
  // could; otherwise exhaustion (live memory alone leaves no room).
  bool fragmentation = false;
};

class TorchCachingModel {
 public:
  // capacity: device bytes. Addresses of new cudaMalloc segments come from the address source
  // when set (e.g. the ones a recording used), else from a bump allocator far from them.
  TorchCachingModel(const trace::TorchSettings& settings, uint64_t capacity);
  ~TorchCachingModel();
  TorchCachingModel(const TorchCachingModel&) = delete;
  TorchCachingModel& operator=(const TorchCachingModel&) = delete;

  using AddressSource = std::function<std::optional<uint64_t>(uint64_t size)>;
  void set_address_source(AddressSource src) { address_source_ = std::move(src); }
  void set_op(uint64_t op) noexcept { op_ = op; }
  void record_events(bool on) noexcept { record_events_ = on; }

  // The state before a recording began: one cudaMalloc'd segment with its live blocks (sorted
  // by address, inside the segment; a block's size is its extent in the segment). The gaps
  // between them become free blocks. Not for expandable segments. Returns false (and adds
  // nothing) if the blocks do not fit the segment or the device.
  struct LiveBlock {
    uint32_t id = 0;
    uint64_t addr = 0;
    uint64_t size = 0;
  };
  bool add_segment(uint64_t addr, uint64_t size, uint64_t stream, bool small_pool,
                   const std::vector<LiveBlock>& live);

  // Allocates `size` bytes on `stream` as block `id` (ids are the caller's, unique while live).
  // Returns false on OOM (see first_oom / oom_count).
  bool malloc(uint32_t id, uint64_t size, uint64_t stream);
  // Frees block `id`; a no-op for an id not live (e.g. one whose malloc failed).
  void free(uint32_t id);
  // torch.cuda.empty_cache(): releases every unsplit cached segment / unused page.
  void empty_cache();
  // The device refuses the next malloc's new memory (cudaMalloc, or mapping pages) until that
  // malloc has released `bytes` of cached segments, or every one it can: a free-and-retry a
  // recording shows (trace::TraceRelease), where the real device took the retry once PyTorch
  // had released that much. A malloc that a cached block serves releases nothing.
  void refuse_next_device_allocation(uint64_t bytes) noexcept {
    refuse_device_ = true;
    refuse_until_released_ = bytes;
  }
  // What a malloc of `size` bytes on `stream` that found no cached block and whose every
  // cudaMalloc failed releases before it reports the OOM: oversize cached blocks (with
  // max_split_size), then every unsplit cached segment. For a recorded OOM, whose allocation
  // is not in the trace.
  void release_for_failed_malloc(uint64_t size, uint64_t stream);

  uint64_t reserved() const noexcept { return reserved_; }
  uint64_t peak_reserved() const noexcept { return peak_reserved_; }
  uint64_t allocated() const noexcept { return allocated_; }
  uint64_t oom_count() const noexcept { return ooms_; }
  const std::optional<TorchOom>& first_oom() const noexcept { return first_oom_; }
  const std::vector<TorchSegmentEvent>& segment_events() const noexcept { return events_; }
  const DriverTally& driver_calls() const noexcept { return calls_; }
  const trace::TorchSettings& settings() const noexcept { return s_; }
  // Largest free cached block (any pool, any stream).
  uint64_t largest_free_block() const;
  // Where live block `id` lies; nullopt for an id not live.
  std::optional<uint64_t> address_of(uint32_t id) const;

  struct Block;
  struct Pool;

 private:
  Pool& pool_for(uint64_t rounded, bool small);
  Block* new_block();
  // A new block for [ptr, ptr + size) of b's segment, on b's stream, in pool (not linked yet).
  Block* new_piece(Pool& pool, const Block* b, uint64_t ptr, uint64_t size);
  void delete_block(Block* b);
  bool get_free_block(Pool& pool, uint64_t stream, uint64_t size, Block** out);
  bool alloc_block(Pool& pool, uint64_t stream, uint64_t size, uint64_t alloc_size, Block** out);
  Block* try_allocate_expandable(Pool& pool, uint64_t stream, uint64_t size);
  Block* find_expandable(Pool& pool, uint64_t stream, uint64_t size);
  bool map_block(Block* b, uint64_t size);
  void unmap_block(Block* b);
  void release_expandable_segment(Block* b);
  bool release_available_cached_blocks(Pool& pool, uint64_t stream, uint64_t size);
  void release_cached_blocks();
  void release_blocks(Pool& pool);
  void release_block(Block* b);
  void garbage_collect();
  bool should_split(const Block* b, uint64_t size) const;
  Block* split_and_take(Pool& pool, Block* b, uint64_t size, bool split);
  uint64_t try_merge(Block* dst, Block* src, Pool& pool);
  void free_block(Block* b);
  void event(TorchSegmentEvent::Kind k, uint64_t addr, uint64_t size);
  uint64_t fresh_address(uint64_t size);
  void note_oom(uint64_t size, uint64_t rounded);

  trace::TorchSettings s_;
  DeviceMemory mem_;
  uint64_t allowed_ = 0;  // memory fraction x capacity (when a fraction is set)
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  std::deque<Block> storage_;
  std::vector<Block*> spare_;
  std::unordered_map<uint32_t, Block*> live_;
  std::vector<std::unique_ptr<TorchExpandableSegment>> segments_;
  AddressSource address_source_;
  uint64_t next_fake_address_;
  uint64_t reserved_ = 0;
  uint64_t peak_reserved_ = 0;
  uint64_t allocated_ = 0;
  uint64_t ooms_ = 0;
  uint64_t op_ = 0;
  bool record_events_ = true;
  bool refuse_device_ = false;  // refuse_next_device_allocation
  uint64_t refuse_until_released_ = 0;
  std::optional<TorchOom> first_oom_;
  std::vector<TorchSegmentEvent> events_;
  DriverTally calls_;
};

}  // namespace expanse::replay
