#include "core/front/front_blocks.hpp"

#include <tuple>

namespace expanse::core {

FrontBlocks::Claim FrontBlocks::claim(CUdeviceptr addr, StreamKey key, size_t expected_size,
                                      Entry** out) {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(addr);
  if (it == s.map.end()) return Claim::unknown;
  Entry& e = it->second;
  if (e.state.load(std::memory_order_acquire) != live) return Claim::not_live;
  if (e.key != key || (expected_size != 0 && expected_size != e.requested)) return Claim::other;
  e.state.store(cached, std::memory_order_release);
  *out = &e;
  return Claim::claimed;
}

bool FrontBlocks::seize(CUdeviceptr addr) {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(addr);
  if (it == s.map.end()) return true;
  uint8_t expected = live;
  return it->second.state.compare_exchange_strong(expected, cached, std::memory_order_acq_rel);
}

FrontBlocks::Entry* FrontBlocks::insert_cached(CUdeviceptr addr, StreamKey key, size_t size,
                                               size_t requested) {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto [it, added] = s.map.emplace(std::piecewise_construct, std::forward_as_tuple(addr),
                                   std::forward_as_tuple());
  (void)added;
  Entry& e = it->second;
  e.key = key;
  e.size = size;
  e.requested = requested;
  e.state.store(cached, std::memory_order_release);
  return &e;
}

const FrontBlocks::Entry* FrontBlocks::find(CUdeviceptr addr) const {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(addr);
  return it == s.map.end() ? nullptr : &it->second;
}

int FrontBlocks::user_holds(CUdeviceptr addr, size_t* requested) const {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(addr);
  if (it == s.map.end()) return -1;
  if (it->second.state.load(std::memory_order_acquire) != live) return 0;
  if (requested != nullptr) *requested = it->second.requested;
  return 1;
}

void FrontBlocks::erase(CUdeviceptr addr) {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  s.map.erase(addr);
}

bool FrontBlocks::erase_unless_cached(CUdeviceptr addr) {
  Shard& s = shard(addr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(addr);
  if (it == s.map.end()) return true;
  if (it->second.state.load(std::memory_order_acquire) != live) return false;
  s.map.erase(it);
  return true;
}

std::vector<CUdeviceptr> FrontBlocks::owed() const {
  std::vector<CUdeviceptr> out;
  for (Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& [addr, e] : s.map) {
      if (e.owed) out.push_back(addr);
    }
  }
  return out;
}

}  // namespace expanse::core
