#include "models/torch_caching_model.hpp"

#include <algorithm>

namespace expanse::replay {

using driver::EntryPoint;

struct TorchCachingModel::Block {
  uint64_t ptr = 0;
  uint64_t size = 0;
  uint64_t stream = 0;
  Pool* pool = nullptr;
  Block* prev = nullptr;  // neighbours in the same segment
  Block* next = nullptr;
  TorchExpandableSegment* segment = nullptr;  // expandable segments only
  bool allocated = false;
  bool mapped = true;
  int64_t gc_base = 0;  // the pool's get_free_block count when cached (garbage collection age)

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
};

namespace {

using Block = TorchCachingModel::Block;

// Free blocks: by stream, then size, then address (best fit, lowest address on ties).
struct BySize {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
// Unmapped ranges of expandable segments: by stream, then address.
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->ptr < b->ptr;
  }
};

void splice(Block* b, Block* before, Block* after) {
  b->prev = before;
  if (before != nullptr) before->next = b;
  b->next = after;
  if (after != nullptr) after->prev = b;
}

// Model-made addresses live far above any a real process gets from cudaMalloc.
constexpr uint64_t kFakeAddressBase = uint64_t{1} << 56;

}  // namespace

struct TorchCachingModel::Pool {
  explicit Pool(bool is_small) : small(is_small) {}
  bool small;
  std::set<Block*, BySize> blocks;
  std::set<Block*, ByAddress> unmapped;
  int64_t get_free_calls = 0;

  void insert(Block* b) {
    b->gc_base = get_free_calls;
    blocks.insert(b);
  }
};

const char* segment_event_name(TorchSegmentEvent::Kind k) noexcept {
  switch (k) {
    case TorchSegmentEvent::Kind::segment_alloc:
      return "segment_alloc";
    case TorchSegmentEvent::Kind::segment_free:
      return "segment_free";
    case TorchSegmentEvent::Kind::segment_map:
      return "segment_map";
    case TorchSegmentEvent::Kind::segment_unmap:
      return "segment_unmap";
  }
  return "?";
}

TorchCachingModel::TorchCachingModel(const trace::TorchSettings& settings, uint64_t capacity)
    : s_(settings),
      small_(std::make_unique<Pool>(true)),
      large_(std::make_unique<Pool>(false)),
      next_fake_address_(kFakeAddressBase) {
  mem_.capacity = capacity;
  if (s_.memory_fraction > 0) {
    allowed_ = static_cast<uint64_t>(s_.memory_fraction * static_cast<double>(capacity));
  }
}

TorchCachingModel::~TorchCachingModel() = default;

TorchCachingModel::Block* TorchCachingModel::new_block() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    *b = Block{};
    return b;
  }
  storage_.emplace_back();
  return &storage_.back();
}

TorchCachingModel::Block* TorchCachingModel::new_piece(Pool& pool, const Block* b, uint64_t ptr,
                                                       uint64_t size) {
  Block* p = new_block();
  p->ptr = ptr;
  p->size = size;
  p->stream = b->stream;
  p->pool = &pool;
  p->segment = b->segment;
  return p;
}

void TorchCachingModel::delete_block(Block* b) { spare_.push_back(b); }

void TorchCachingModel::event(TorchSegmentEvent::Kind k, uint64_t addr, uint64_t size) {
  if (record_events_) events_.push_back({k, op_, addr, size});
}

uint64_t TorchCachingModel::fresh_address(uint64_t size) {
  if (address_source_) {
    if (auto a = address_source_(size)) return *a;
  }
  const uint64_t a = next_fake_address_;
  constexpr uint64_t g = trace::kSmallBuffer;
  next_fake_address_ += (size + g - 1) / g * g;
  return a;
}

bool TorchCachingModel::add_segment(uint64_t addr, uint64_t size, uint64_t stream, bool small_pool,
                                    const std::vector<LiveBlock>& live) {
  uint64_t cursor = addr;
  for (const LiveBlock& l : live) {
    if (l.addr < cursor || l.size == 0 || l.addr + l.size > addr + size || live_.count(l.id)) {
      return false;
    }
    cursor = l.addr + l.size;
  }
  if (!mem_.take(size)) return false;
  Pool& pool = small_pool ? *small_ : *large_;
  Block* prev = nullptr;
  auto piece = [&](uint64_t p, uint64_t n, bool allocated) {
    Block* b = new_block();
    b->ptr = p;
    b->size = n;
    b->stream = stream;
    b->pool = &pool;
    b->allocated = allocated;
    splice(b, prev, nullptr);
    prev = b;
    if (allocated) {
      allocated_ += n;
    } else {
      pool.insert(b);
    }
    return b;
  };
  cursor = addr;
  for (const LiveBlock& l : live) {
    if (l.addr > cursor) piece(cursor, l.addr - cursor, false);
    live_[l.id] = piece(l.addr, l.size, true);
    cursor = l.addr + l.size;
  }
  if (cursor < addr + size) piece(cursor, addr + size - cursor, false);
  reserved_ += size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  return true;
}

bool TorchCachingModel::get_free_block(Pool& pool, uint64_t stream, uint64_t size, Block** out) {
  if (s_.memory_fraction > 0 && s_.garbage_collection_threshold > 0) ++pool.get_free_calls;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) return false;
  if ((*it)->segment != nullptr) {
    // A block that can grow into the unmapped pages after it counts with them for best fit.
    auto growable = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while ((*it)->segment != nullptr && next != pool.blocks.end() && (*next)->stream == stream &&
           growable(*next) < growable(*it)) {
      it = next++;
    }
  }
  const Block* b = *it;
  // Oversize blocks serve only oversize requests, and only ones close to their size.
  if (size < s_.max_split_size && b->size >= s_.max_split_size) return false;
  if (size >= s_.max_split_size && b->size >= size + s_.max_non_split_rounding) return false;
  *out = *it;
  pool.blocks.erase(it);
  return true;
}

bool TorchCachingModel::alloc_block(Pool& pool, uint64_t stream, uint64_t size, uint64_t alloc_size,
                                    Block** out) {
  if (s_.memory_fraction > 0 && reserved_ + alloc_size > allowed_) return false;
  if (refuse_device_ && refuse_until_released_ > 0) return false;
  if (s_.expandable_segments) {
    *out = try_allocate_expandable(pool, stream, size);
    return *out != nullptr;
  }
  calls_.cuda_malloc(alloc_size);
  if (!mem_.take(alloc_size)) return false;
  Block* b = new_block();
  b->ptr = fresh_address(alloc_size);
  b->size = alloc_size;
  b->stream = stream;
  b->pool = &pool;
  reserved_ += alloc_size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  event(TorchSegmentEvent::Kind::segment_alloc, b->ptr, alloc_size);
  *out = b;
  return true;
}

TorchCachingModel::Block* TorchCachingModel::find_expandable(Pool& pool, uint64_t stream,
                                                             uint64_t size) {
  auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
  auto has_room = [&](const Block* b) {
    uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  // The lowest address of this stream's segments where free and unmapped space together fit.
  Block key;
  key.stream = stream;
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  // None: a new segment for this stream and pool.
  const uint64_t page = pool.small ? trace::kSmallBuffer : trace::kLargeBuffer;
  const uint64_t base = (next_fake_address_ + page - 1) / page * page;
  auto seg = std::make_unique<TorchExpandableSegment>(base, page, mem_.capacity, stream);
  next_fake_address_ = base + seg->size();
  calls_.vmm(EntryPoint::mem_address_reserve, 0);
  Block* c = new_block();
  c->ptr = base;
  c->size = seg->size();
  c->stream = stream;
  c->pool = &pool;
  c->segment = seg.get();
  c->mapped = false;
  segments_.push_back(std::move(seg));
  pool.unmapped.insert(c);
  return c;
}

bool TorchCachingModel::map_block(Block* b, uint64_t size) {
  const uint64_t at = b->ptr;
  const uint64_t mapped = b->segment->map(b->ptr, size, mem_, calls_);
  if (mapped == 0) return false;
  Pool& pool = *b->pool;
  pool.unmapped.erase(b);
  b->mapped = true;
  if (mapped < b->size) {
    Block* rest = new_piece(pool, b, b->ptr + mapped, b->size - mapped);
    rest->mapped = false;
    splice(rest, b, b->next);
    pool.unmapped.insert(rest);
    b->size = mapped;
  }
  try_merge(b, b->prev, pool);
  try_merge(b, b->next, pool);
  pool.insert(b);
  reserved_ += mapped;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  event(TorchSegmentEvent::Kind::segment_map, at, mapped);
  return true;
}

TorchCachingModel::Block* TorchCachingModel::try_allocate_expandable(Pool& pool, uint64_t stream,
                                                                     uint64_t size) {
  Block* c = find_expandable(pool, stream, size);
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    Block* n = c->next;  // unmapped: map what is missing and merge
    if (n == nullptr || !map_block(n, std::min(size - c->size, n->size))) return nullptr;
    c = n;
  }
  pool.blocks.erase(c);
  return c;
}

void TorchCachingModel::unmap_block(Block* b) {
  const auto range = b->segment->unmap(b->ptr, b->size, mem_, calls_);
  if (range.size == 0) return;
  Pool& pool = *b->pool;
  pool.blocks.erase(b);
  const uint64_t before = range.ptr - b->ptr;
  if (before > 0) {  // partial page at the front stays mapped and free
    Block* f = new_piece(pool, b, b->ptr, before);
    splice(f, b->prev, b);
    pool.insert(f);
  }
  const uint64_t after = b->size - before - range.size;
  if (after > 0) {
    Block* f = new_piece(pool, b, range.ptr + range.size, after);
    splice(f, b, b->next);
    pool.insert(f);
  }
  b->ptr = range.ptr;
  b->size = range.size;
  b->mapped = false;
  try_merge(b, b->prev, pool);
  try_merge(b, b->next, pool);
  pool.unmapped.insert(b);
  reserved_ -= range.size;
  refuse_until_released_ -= std::min(refuse_until_released_, range.size);
  event(TorchSegmentEvent::Kind::segment_unmap, range.ptr, range.size);
}

void TorchCachingModel::release_expandable_segment(Block* b) {
  b->pool->unmapped.erase(b);
  calls_.vmm(EntryPoint::mem_address_free, 0);
  auto it = std::find_if(segments_.begin(), segments_.end(),
                         [b](const auto& s) { return s.get() == b->segment; });
  if (it != segments_.end()) segments_.erase(it);
  delete_block(b);
}

void TorchCachingModel::release_block(Block* b) {
  refuse_until_released_ -= std::min(refuse_until_released_, b->size);
  calls_.cuda_free(b->size);
  mem_.give(b->size);
  reserved_ -= b->size;
  b->pool->blocks.erase(b);
  event(TorchSegmentEvent::Kind::segment_free, b->ptr, b->size);
  delete_block(b);
}

bool TorchCachingModel::release_available_cached_blocks(Pool& pool, uint64_t stream,
                                                        uint64_t size) {
  if (s_.max_split_size == std::numeric_limits<uint64_t>::max() || s_.expandable_segments) {
    return false;
  }
  Block key;
  key.stream = stream;
  key.size = std::max(size, s_.max_split_size);
  auto it = pool.blocks.lower_bound(&key);
  if (it != pool.blocks.end() && (*it)->stream == stream) {
    if ((*it)->is_split()) return false;
    release_block(*it);
    return true;
  }
  // No single oversize block is enough: release the largest ones until they add up.
  if (it == pool.blocks.begin()) return false;
  uint64_t released = 0;
  --it;
  while (released < key.size && (*it)->size >= s_.max_split_size && (*it)->stream == stream &&
         !(*it)->is_split()) {
    Block* cur = *it;
    released += cur->size;
    if (it == pool.blocks.begin()) {
      release_block(cur);
      break;
    }
    --it;
    release_block(cur);
  }
  return released >= key.size;
}

void TorchCachingModel::release_blocks(Pool& pool) {
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it++;
    if (b->segment != nullptr) {
      to_unmap.push_back(b);
    } else if (!b->is_split()) {
      release_block(b);
    }
  }
  for (Block* b : to_unmap) {
    unmap_block(b);
    if (!b->mapped && !b->is_split()) release_expandable_segment(b);
  }
}

void TorchCachingModel::release_cached_blocks() {
  release_blocks(*large_);
  release_blocks(*small_);
  refuse_device_ = false;  // the retry after a full release gets its memory
}

void TorchCachingModel::empty_cache() { release_cached_blocks(); }

void TorchCachingModel::release_for_failed_malloc(uint64_t size, uint64_t stream) {
  const uint64_t rounded = trace::torch_round_size(s_, size);
  release_available_cached_blocks(rounded <= trace::kSmallSize ? *small_ : *large_, stream,
                                  rounded);
  release_cached_blocks();
}

void TorchCachingModel::garbage_collect() {
  const auto threshold =
      static_cast<uint64_t>(s_.garbage_collection_threshold * static_cast<double>(allowed_));
  if (reserved_ <= threshold) return;
  const uint64_t target = reserved_ - threshold;
  Pool& pool = *large_;
  auto age = [&pool](const Block* b) {
    return static_cast<uint64_t>(pool.get_free_calls - b->gc_base);
  };
  uint64_t total_age = 0;
  uint64_t count = 0;
  for (const Block* b : pool.blocks) {
    if (!b->is_split() && b->segment == nullptr) {
      total_age += age(b);
      ++count;
    }
  }
  uint64_t reclaimed = 0;
  bool freed = true;
  // Release blocks at least as old as the average until enough is reclaimed.
  while (reclaimed < target && freed && count > 0) {
    const double average = static_cast<double>(total_age) / static_cast<double>(count);
    freed = false;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it++;
      if (!b->is_split() && b->segment == nullptr && static_cast<double>(age(b)) >= average) {
        freed = true;
        reclaimed += b->size;
        total_age -= age(b);
        --count;
        release_block(b);
      }
    }
  }
}

bool TorchCachingModel::should_split(const Block* b, uint64_t size) const {
  const uint64_t rest = b->size - size;
  if (b->pool->small || s_.expandable_segments) return rest >= trace::kMinBlockSize;
  return size < s_.max_split_size && rest > trace::kSmallSize;
}

TorchCachingModel::Block* TorchCachingModel::split_and_take(Pool& pool, Block* b, uint64_t size,
                                                            bool split) {
  if (split) {
    Block* front = new_piece(pool, b, b->ptr, size);
    splice(front, b->prev, b);
    b->ptr += size;
    b->size -= size;
    pool.insert(b);
    b = front;
  }
  b->allocated = true;
  allocated_ += b->size;
  return b;
}

uint64_t TorchCachingModel::try_merge(Block* dst, Block* src, Pool& pool) {
  if (src == nullptr || src->allocated || dst->mapped != src->mapped) return 0;
  if (src->mapped) {
    pool.blocks.erase(src);
  } else {
    pool.unmapped.erase(src);
  }
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  dst->size += src->size;
  const uint64_t n = src->size;
  delete_block(src);
  return n;
}

void TorchCachingModel::free_block(Block* b) {
  b->allocated = false;
  allocated_ -= b->size;
  Pool& pool = *b->pool;
  try_merge(b, b->prev, pool);
  try_merge(b, b->next, pool);
  pool.insert(b);
}

uint64_t TorchCachingModel::largest_free_block() const {
  uint64_t m = 0;
  for (const Pool* p : {small_.get(), large_.get()}) {
    for (const Block* b : p->blocks) m = std::max(m, b->size);
  }
  return m;
}

std::optional<uint64_t> TorchCachingModel::address_of(uint32_t id) const {
  auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  return it->second->ptr;
}

void TorchCachingModel::note_oom(uint64_t size, uint64_t rounded) {
  ++ooms_;
  if (first_oom_) return;
  TorchOom o;
  o.op = op_;
  o.request = size;
  o.rounded = rounded;
  o.reserved = reserved_;
  o.allocated = allocated_;
  o.device_free = mem_.free();
  o.largest_free_block = largest_free_block();
  o.fragmentation = allocated_ + rounded <= mem_.capacity;
  first_oom_ = o;
}

bool TorchCachingModel::malloc(uint32_t id, uint64_t size, uint64_t stream) {
  const uint64_t rounded = trace::torch_round_size(s_, size);
  Pool& pool = rounded <= trace::kSmallSize ? *small_ : *large_;
  const uint64_t alloc_size = trace::torch_allocation_size(rounded);
  Block* b = nullptr;
  bool found = get_free_block(pool, stream, rounded, &b);
  if (!found) {
    if (s_.memory_fraction > 0 && s_.garbage_collection_threshold > 0) garbage_collect();
    found = alloc_block(pool, stream, rounded, alloc_size, &b) ||
            (release_available_cached_blocks(pool, stream, rounded) &&
             alloc_block(pool, stream, rounded, alloc_size, &b));
    if (!found) {
      release_cached_blocks();
      found = alloc_block(pool, stream, rounded, alloc_size, &b);
    }
  }
  refuse_device_ = false;
  if (!found) {
    note_oom(size, rounded);
    return false;
  }
  live_[id] = split_and_take(pool, b, rounded, should_split(b, rounded));
  return true;
}

void TorchCachingModel::free(uint32_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Block* b = it->second;
  live_.erase(it);
  free_block(b);
}

}  // namespace expanse::replay
