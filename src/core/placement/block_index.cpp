#include "core/placement/block_index.hpp"

#include "core/base/check.hpp"
#include "core/base/options.hpp"

#include <algorithm>

namespace expanse::core {

void BlockIndex::add_reservation(const Reservation& r) {
  [[maybe_unused]] auto [it, inserted] = blocks_.emplace(r.base, Block{});
  EXPANSE_ASSERT(inserted);
  it->second.size = r.size;
  it->second.res = r.id;
  index(r.arena, it);
}

void BlockIndex::remove_reservation(const Reservation& r) {
  auto it = blocks_.find(r.base);
  EXPANSE_ASSERT(it != blocks_.end() && it->second.size == r.size &&
                 it->second.state == BlockState::free && it->second.safe);
  unindex(r.arena, it);
  blocks_.erase(it);
}

void BlockIndex::add_pool(PoolSlot p) {
  if (p >= pools_.size()) pools_.resize(size_t{p} + 1);
}

bool BlockIndex::pool_has_free(PoolSlot p) const noexcept {
  if (p >= pools_.size()) return false;
  for (int i = 0; i < kArenaCount; ++i) {
    if (!pools_[p].safe[i].empty() || !pools_[p].owned[i].empty()) return true;
  }
  return false;
}

BlockIt BlockIndex::move_to_pool(BlockIt it, Arena a, PoolSlot p) {
  EXPANSE_ASSERT(it->second.state == BlockState::free);
  add_pool(p);
  unindex(a, it);
  it->second.pool = p;
  return insert_free(it, a);
}

void BlockIndex::make_room(PoolSlot p) {
  EXPANSE_ASSERT(p < pools_.size());
  if (spare_entries_.empty()) {
    SizeSet s;
    s.emplace(0, 0);
    spare_entries_.keep(s.extract(s.begin()));
  }
  if (spare_owners_.empty()) {
    OwnerMap m;
    m.try_emplace(0);
    spare_owners_.keep(m.extract(m.begin()));
  }
  // A new owner must not make the map grow its buckets either (an empty map may not have sized
  // them yet; a full one grows now, by its own policy).
  for (OwnerMap& o : pools_[p].owned) {
    // (A map never filled has one bucket and no array; an emptied one keeps its array.)
    if (o.bucket_count() <= 1 ||
        static_cast<double>(o.size() + 1) >
            static_cast<double>(o.max_load_factor()) * static_cast<double>(o.bucket_count())) {
      o.reserve(o.size() + 1);
    }
  }
}

void BlockIndex::insert_entry(SizeSet& set, const std::pair<size_t, CUdeviceptr>& v) {
  if (spare_entries_.empty()) {
    set.insert(v);
    return;
  }
  SizeSet::node_type n = spare_entries_.take();
  n.value() = v;
  set.insert(std::move(n));
}

BlockIt BlockIndex::insert_block(BlockIt hint, CUdeviceptr key, Block&& b) {
  if (spare_blocks_.empty()) return blocks_.emplace_hint(hint, key, std::move(b));
  BlockMap::node_type n = spare_blocks_.take();
  n.key() = key;
  n.mapped() = std::move(b);
  return blocks_.insert(hint, std::move(n));
}

void BlockIndex::erase_block(BlockIt it) { spare_blocks_.keep(blocks_.extract(it)); }

void BlockIndex::index(Arena a, BlockIt it) {
  Block& b = it->second;
  b.state = BlockState::free;
  EXPANSE_ASSERT(b.pool < pools_.size());
  FreeSets& f = pools_[b.pool];
  const int i = static_cast<int>(a);
  if (b.safe) {
    insert_entry(f.safe[i], {b.size, it->first});
    return;
  }
  auto o = f.owned[i].find(b.stream);
  if (o == f.owned[i].end()) {
    if (spare_owners_.empty()) {
      o = f.owned[i].try_emplace(b.stream).first;
    } else {
      OwnerMap::node_type n = spare_owners_.take();
      n.key() = b.stream;
      o = f.owned[i].insert(std::move(n)).position;
    }
  }
  insert_entry(o->second, {b.size, it->first});
}

void BlockIndex::unindex(Arena a, BlockIt it) {
  const Block& b = it->second;
  EXPANSE_ASSERT(b.state == BlockState::free);
  int i = static_cast<int>(a);
  FreeSets& f = pools_[b.pool];
  auto keep = [&](SizeSet& set) { spare_entries_.keep(set.extract({b.size, it->first})); };
  if (b.safe) {
    keep(f.safe[i]);
    return;
  }
  auto o = f.owned[i].find(b.stream);
  EXPANSE_ASSERT(o != f.owned[i].end());
  keep(o->second);
  if (!o->second.empty()) return;
  spare_owners_.keep(f.owned[i].extract(o));
}

BlockIt BlockIndex::best_fit(Arena a, size_t bytes, StreamKey stream, PoolSlot p) {
  return first_fit_where(a, bytes, stream, 1, [](BlockIt) { return true; }, p);
}

// What lies after the first `bytes` of b: free memory of the same reservation, pool and owner.
static Block rest_of(const Block& b, size_t bytes) {
  Block rest;
  rest.size = b.size - bytes;
  rest.res = b.res;
  rest.pool = b.pool;
  rest.safe = b.safe;
  rest.stream = b.stream;
  rest.freed_by = b.freed_by;
  rest.seq = b.seq;
  return rest;
}

BlockIt BlockIndex::carve(BlockIt it, size_t bytes, Arena a, size_t offset) {
  EXPANSE_ASSERT(it->second.state == BlockState::free && it->second.size >= offset + bytes);
  EXPANSE_ASSERT(bytes % kBlockAlignment == 0 && offset % kBlockAlignment == 0);
  unindex(a, it);
  if (offset != 0) {
    // Leave [start, start+offset) free with the same owner; carve from the rest.
    Block tail = it->second;
    tail.size -= offset;
    it->second.size = offset;
    index(a, it);
    it = insert_block(std::next(it), it->first + offset, std::move(tail));
  }
  Block& b = it->second;
  if (b.size > bytes) {
    auto r = insert_block(std::next(it), it->first + bytes, rest_of(b, bytes));
    index(a, r);
    b.size = bytes;
  }
  return it;
}

void BlockIndex::split_tail(BlockIt it, size_t bytes, Arena a) {
  Block& b = it->second;
  EXPANSE_ASSERT(bytes % kBlockAlignment == 0 && bytes < b.size);
  Block rest = rest_of(b, bytes);
  b.size = bytes;
  auto r = insert_block(std::next(it), it->first + bytes, std::move(rest));
  insert_free(r, a);
}

// Free neighbours merge unless that would give a stream's free memory to another stream: two
// safe blocks always; two blocks owned by S; a safe block and one owned by S when S freed the
// safe one too, or nobody did (never allocated). The merge is owned by S (conservative: other
// streams wait for S's next fence). Within one stream coalescing is maximal, so placement does
// not depend on when fences happen to complete and a repeated workload lands where it landed
// before; across streams, memory T freed (and a fence proved done) stays T's to reuse in place
// instead of waiting for S's next fence, which S records only from its own calls.
bool BlockIndex::mergeable(const Block& x, const Block& y) const noexcept {
  if (x.state != BlockState::free || y.state != BlockState::free || x.res != y.res ||
      x.pool != y.pool) {
    return false;
  }
  if (x.safe && y.safe) return true;
  if (!x.safe && !y.safe) return x.stream == y.stream;
  const Block& s = x.safe ? x : y;
  const Block& o = x.safe ? y : x;
  return s.freed_by == kNeverFreed || s.freed_by == o.stream;
}

// The owner of a merge of x and y (mergeable).
static void merge_owner(Block& into, const Block& other) {
  if (into.safe && !other.safe) {
    into.safe = false;
    into.stream = other.stream;
  } else if (into.safe && other.safe && into.freed_by != other.freed_by) {
    if (into.freed_by == kNeverFreed) {
      into.freed_by = other.freed_by;
    } else if (other.freed_by != kNeverFreed) {
      into.freed_by = kFreedByMany;
    }
  }
  into.seq = std::max(into.seq, other.seq);
}

BlockIt BlockIndex::insert_free(BlockIt it, Arena a) {
  it->second.state = BlockState::free;
  it->second.requested = 0;
  it->second.users.clear();
  // Merge with the previous block.
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size == it->first && mergeable(prev->second, it->second)) {
      unindex(a, prev);
      prev->second.size += it->second.size;
      merge_owner(prev->second, it->second);
      erase_block(it);
      it = prev;
    }
  }
  // Merge with the next block.
  auto next = std::next(it);
  if (next != blocks_.end() && it->first + it->second.size == next->first &&
      mergeable(it->second, next->second)) {
    unindex(a, next);
    it->second.size += next->second.size;
    merge_owner(it->second, next->second);
    erase_block(next);
  }
  index(a, it);
  return it;
}

BlockIt BlockIndex::make_safe(BlockIt it, Arena a) {
  EXPANSE_ASSERT(it->second.state == BlockState::free && !it->second.safe);
  unindex(a, it);
  it->second.safe = true;
  it->second.freed_by = it->second.stream;
  it->second.stream = 0;
  it->second.seq = 0;
  return insert_free(it, a);
}

std::vector<BlockIt> BlockIndex::owned_up_to(Arena a, StreamKey stream, uint64_t upto) {
  std::vector<BlockIt> out;
  for (FreeSets& f : pools_) {
    auto o = f.owned[static_cast<int>(a)].find(stream);
    if (o == f.owned[static_cast<int>(a)].end()) continue;
    for (const auto& [size, addr] : o->second) {
      auto it = blocks_.find(addr);
      EXPANSE_ASSERT(it != blocks_.end() && !it->second.safe && it->second.stream == stream);
      if (it->second.seq <= upto) out.push_back(it);
    }
  }
  return out;
}

bool BlockIndex::any_unsafe() const noexcept {
  for (const FreeSets& f : pools_) {
    for (const auto& m : f.owned) {
      if (!m.empty()) return true;
    }
  }
  return false;
}

bool BlockIndex::any_unsafe_but(StreamKey stream) const noexcept {
  for (const FreeSets& f : pools_) {
    for (const auto& m : f.owned) {
      if (m.size() > 1 || (m.size() == 1 && m.begin()->first != stream)) return true;
    }
  }
  return false;
}

std::vector<StreamKey> BlockIndex::streams_with_unsafe() const {
  std::vector<StreamKey> out;
  for (const FreeSets& f : pools_) {
    for (const auto& m : f.owned) {
      for (const auto& [s, set] : m) {
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
      }
    }
  }
  return out;
}

size_t BlockIndex::free_blocks() const noexcept {
  size_t n = 0;
  for (const FreeSets& f : pools_) {
    for (const auto& s : f.safe) n += s.size();
    for (const auto& m : f.owned) {
      for (const auto& [k, set] : m) n += set.size();
    }
  }
  return n;
}

}  // namespace expanse::core
