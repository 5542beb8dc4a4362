#include "core/pools/pool_table.hpp"

#include "core/base/check.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <limits>

namespace expanse::core {

std::string pool_name(PoolId id, int device) {
  return "pool " + std::to_string(id) + " on device " + std::to_string(device);
}

PoolSlot PoolTable::create(PoolId id, int device) {
  if (id == 0) throw usage_error("expanse: pool id 0 is never a pool");
  if (by_id_.count(id) != 0 || forgotten_.count(id) != 0) {
    throw usage_error("expanse: " + pool_name(id, device) + " exists already (ids are never reused)");
  }
  PoolSlot s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (slots_.size() > std::numeric_limits<PoolSlot>::max()) {
      throw usage_error("expanse: cannot create " + pool_name(id, device) + ": " +
                        std::to_string(slots_.size() - 1) +
                        " pools are in use (release some; a released pool is forgotten once its "
                        "memory is returned and its last block freed)");
    }
    s = static_cast<PoolSlot>(slots_.size());
    slots_.emplace_back();
  }
  slots_[s] = PoolState{};
  slots_[s].id = id;
  slots_[s].use_count = 1;
  by_id_.emplace(id, s);
  return s;
}

PoolSlot PoolTable::find(PoolId id, const char* what, int device, bool need_live) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    const bool gone = forgotten_.count(id) != 0;
    throw usage_error(std::string("expanse: ") + what + ": " +
                      (id == 0 ? std::string("pool id 0 is never a pool")
                               : pool_name(id, device) +
                                     (gone ? " was released and its memory returned"
                                           : " does not exist")) +
                      "; nothing was changed");
  }
  if (need_live && slots_[it->second].use_count == 0) {
    throw usage_error(std::string("expanse: ") + what + ": " + pool_name(id, device) +
                      " was released (its use count reached 0); nothing was changed");
  }
  return it->second;
}

void PoolTable::forget(PoolSlot s) {
  EXPANSE_ASSERT(s != kDefaultPool && slots_[s].in_use() && slots_[s].returned &&
                 slots_[s].live_blocks == 0);
  make_room_to_forget();  // so that on a throw nothing changed
  spare_forgotten_.value() = slots_[s].id;
  forgotten_.insert(std::move(spare_forgotten_));
  by_id_.erase(slots_[s].id);
  slots_[s] = PoolState{};
  free_slots_.push_back(s);
}

void PoolTable::make_room_to_forget() {
  if (free_slots_.size() == free_slots_.capacity()) {
    free_slots_.reserve(std::max<size_t>(8, 2 * free_slots_.capacity()));
  }
  if (spare_forgotten_.empty()) {
    std::unordered_set<PoolId> one{0};
    spare_forgotten_ = one.extract(one.begin());
  }
  forgotten_.reserve(forgotten_.size() + 1);  // inserting one more does not rehash
}

std::vector<PoolSlot> PoolTable::awaiting_return() const {
  std::vector<PoolSlot> out;
  for_each([&](PoolSlot s, const PoolState& p) {
    if (p.use_count == 0 && !p.returned) out.push_back(s);
  });
  return out;
}

}  // namespace expanse::core
