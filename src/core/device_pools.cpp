// Pools on one device (pool_table.hpp): create, retain, release, return, trim, stats, checks.
#include "core/base/check.hpp"
#include "core/device_allocator.hpp"
#include "core/base/format.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <new>
#include <sstream>

namespace expanse::core {

void DeviceAllocator::create_pool(PoolId id, bool registrable) {
  std::lock_guard<std::mutex> lock(mu_);
  // Every slot held: released pools proven done now are forgotten, freeing theirs.
  if (pools_.full()) return_released_pools();
  const PoolSlot s = pools_.create(id, device());
  pools_.at(s).registrable = registrable;
  placement_.index().add_pool(s);
}

void DeviceAllocator::retain_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  ++pools_.at(pools_.find(id, "pool_retain", device(), true)).use_count;
}

void DeviceAllocator::release_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "pool_release");
  const PoolSlot s = pools_.find(id, "pool_release", device(), true);
  PoolState& p = pools_.at(s);
  // The last release may forget the pool: out of host memory it fails here, still in use.
  if (p.use_count == 1) make_room_to_forget_pool(s);
  if (--p.use_count > 0) return;
  // Its staging is freed later, where freeing pinned memory (which synchronizes) cannot run
  // beside a capture: an asleep pool's backup holds its live blocks' bytes until they wake.
  // Nothing of it left to prove done: forgotten at once.
  if (p.live_blocks == 0 && p.registrable_blocks == 0 && !placement_.index().pool_has_free(s)) {
    bool pending = false;
    for (const auto& [addr, b] : placement_.index().blocks()) {
      if (b.pool == s) {
        pending = true;
        break;
      }
    }
    if (!pending) {
      p.returned = true;
      forget_pool(s);
    }
  }
}

PoolId DeviceAllocator::pool_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (const RegistrableBlock* rb = registrable_.find(reinterpret_cast<CUdeviceptr>(ptr)))
    return rb->pool;
  const auto& blocks = placement_.index().blocks();
  auto it = blocks.find(reinterpret_cast<CUdeviceptr>(ptr));
  if (it == blocks.end() ||
      (it->second.state != BlockState::live && it->second.state != BlockState::asleep) ||
      parked_locked(it->first)) {
    throw usage_error("expanse: pool_of " + hex(reinterpret_cast<CUdeviceptr>(ptr)) +
                      " on device " + std::to_string(device()) + ": " +
                      describe_pointer_locked(ptr));
  }
  return it->second.pool == kDefaultPool ? 0 : pools_.at(it->second.pool).id;
}

void DeviceAllocator::capture_ended(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "capture_ended");
  BlockIndex& index = placement_.index();
  for (StreamKey key : streams_.capture_ended(s)) {
    for (Arena a : {Arena::small, Arena::large}) {
      for (BlockIt it : index.owned_up_to(a, key, UINT64_MAX)) {
        if (it->second.pool != kDefaultPool) index.make_safe(it, a);
      }
    }
  }
}

bool DeviceAllocator::has_pool(PoolId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pools_.contains(id);
}

bool DeviceAllocator::return_released_pools() {
  const std::vector<PoolSlot> waiting = pools_.awaiting_return();
  if (waiting.empty()) return false;
  // The graphs that used a pool run on streams expanse never sees: only a synchronize of the
  // context proves their replays done. Refused while a capture is announced (it would
  // invalidate the capture); the memory then waits for a later try.
  if (!streams_.sync_context(drv_.primary())) return false;
  streams_.poll(false);  // the sync proved every stream of the context: their frees become safe
  for (PoolSlot s : waiting) return_pool(s);
  return true;
}

// Out of host memory it throws with the pool not yet returned (a later try returns it), some of
// its free blocks perhaps the default pool's already, each wholly in one pool's index.
void DeviceAllocator::return_pool(PoolSlot s) {
  PoolState& p = pools_.at(s);
  const bool forget = p.live_blocks == 0 && p.registrable_blocks == 0;
  if (forget) make_room_to_forget_pool(s);
  BlockIndex& index = placement_.index();
  std::vector<CUdeviceptr> free_blocks;
  for (const auto& [addr, b] : index.blocks()) {
    if (b.pool == s && b.state == BlockState::free) free_blocks.push_back(addr);
  }
  for (CUdeviceptr addr : free_blocks) {
    auto it = index.blocks().find(addr);  // not merged away: pools never merge with each other
    EXPANSE_ASSERT(it != index.blocks().end() && it->second.pool == s);
    index.make_room(kDefaultPool);  // moving it then allocates nothing
    index.move_to_pool(it, placement_.arena_of(it->second), kDefaultPool);
  }
  for (auto& [addr, b] : index.blocks()) {
    // Indexed when its streams pass the free: into the default pool.
    if (b.pool == s && b.state == BlockState::pending) b.pool = kDefaultPool;
  }
  p.returned = true;
  if (forget) forget_pool(s);  // room made: cannot throw
}

bool DeviceAllocator::trim_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "pool_trim");
  const PoolSlot s = pools_.find(id, "pool_trim", device(), false);
  const PoolState& p = pools_.at(s);
  if (p.use_count > 0) {
    throw usage_error("expanse: pool_trim: pool " + std::to_string(id) + " on device " +
                      std::to_string(device()) + " is in use (use count " +
                      std::to_string(p.use_count) +
                      "): only a released pool's memory can be given back; nothing was changed");
  }
  if (p.returned) return true;  // its free memory is the default pool's already
  flush_caches_locked();  // parked blocks may sit on pages the pool's memory shares
  try {
    if (!streams_.sync_context(drv_.primary())) return false;
    streams_.poll(false);
    std::vector<ReclaimableHandle> handles;
    BlockIndex& index = placement_.index();
    for (auto it = index.blocks().begin(); it != index.blocks().end(); ++it) {
      const Block& b = it->second;
      if (b.pool == s && b.state == BlockState::free && b.safe) placement_.handles_under(it, handles);
    }
    supply_.give_back(std::move(handles));
    return_pool(s);
    placement_.release_empty_reservations();
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: pool_trim of pool " + std::to_string(id) + " on device " +
                             std::to_string(device()) + ": " + e.what(),
                         static_cast<int>(e.code()));
  }
  return true;
}

void DeviceAllocator::count_in_pool(const Block& b, int sign) {
  PoolState& p = pools_.at(b.pool);
  if (sign > 0) {
    ++p.live_blocks;
    p.requested_bytes += b.requested;
    p.allocated_bytes += b.size;
  } else {
    EXPANSE_ASSERT(p.live_blocks > 0 && p.requested_bytes >= b.requested &&
                   p.allocated_bytes >= b.size);
    --p.live_blocks;
    p.requested_bytes -= b.requested;
    p.allocated_bytes -= b.size;
  }
}

PoolStats DeviceAllocator::pool_stats(PoolId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_stats_locked(pools_.find(id, "pool_get_stats", device(), false));
}

// Recounted from the blocks (a pool's memory is scattered through the reservations).
PoolStats DeviceAllocator::pool_stats_locked(PoolSlot s) const {
  const PoolState& p = pools_.at(s);
  PoolStats out;
  out.id = p.id;
  out.use_count = p.use_count;
  out.returned = p.returned;
  out.live_blocks = p.live_blocks;
  out.requested_bytes = p.requested_bytes;
  out.live_bytes = p.allocated_bytes;
  out.asleep = p.asleep;
  out.host_backup_bytes = p.backup_bytes;
  out.cycles = p.cycles;
  if (p.registrable) {
    const RegistrableBlocks::PoolFigures f = registrable_.of_pool(p.id);
    out.live_blocks += f.blocks;
    out.requested_bytes += f.requested;
    out.live_bytes += f.bytes;
    out.physical_bytes += f.bytes;
  }
  uint32_t last_res = UINT32_MAX;
  size_t next_page = 0;  // first page of last_res not yet counted
  for (const auto& [addr, b] : placement_.index().blocks()) {
    if (b.pool != s) continue;
    if (b.state != BlockState::live && b.state != BlockState::asleep) out.cached_bytes += b.size;
    const Reservation& r = placement_.res(b.res);
    if (b.res != last_res) {
      last_res = b.res;
      next_page = 0;
    }
    for (size_t i = std::max(next_page, r.first_page(addr)); i <= r.last_page(addr, b.size); ++i) {
      if (r.mapped(i)) out.physical_bytes += page_;
    }
    next_page = r.last_page(addr, b.size) + 1;
  }
  return out;
}

void DeviceAllocator::forget_pool(PoolSlot s) {
  make_room_to_forget_pool(s);  // out of host memory, nothing changed
  PoolState& p = pools_.at(s);
  // Freed at the next release_host_backup or release_cached (never from a free, which may run
  // beside another thread's capture: cuMemFreeHost synchronizes).
  if (p.backup != nullptr) orphan_backups_.push_back(p.backup);
  pools_.forget(s);
}

void DeviceAllocator::make_room_to_forget_pool(PoolSlot s) {
  if (pools_.at(s).backup != nullptr && orphan_backups_.size() == orphan_backups_.capacity()) {
    orphan_backups_.reserve(orphan_backups_.size() + 1);
  }
  pools_.make_room_to_forget();
}

void DeviceAllocator::make_room_if_emptying(const Block& b) {
  EXPANSE_ASSERT(b.pool != kDefaultPool);  // the free asks only for pool blocks (its hot path)
  const PoolState& p = pools_.at(b.pool);
  if (p.returned && p.live_blocks == 1) make_room_to_forget_pool(b.pool);
}

std::string DeviceAllocator::pools_holding_memory() const {
  std::ostringstream m;
  bool any = false;
  pools_.for_each([&](PoolSlot s, const PoolState& p) {
    const PoolStats st = pool_stats_locked(s);
    if (st.cached_bytes == 0 && st.live_bytes == 0) return;
    m << (any ? ", " : "; pools holding memory: ") << "pool " << p.id << " ("
      << (p.use_count > 0 ? "use count " + std::to_string(p.use_count)
                          : std::string("released, not yet proven done"))
      << ", live " << conf::format_size(st.live_bytes) << ", cached "
      << conf::format_size(st.cached_bytes) << ")";
    any = true;
  });
  return m.str();
}

// The pools' books against the blocks, and a live pool's free memory still mapped and
// accessible where it is.
std::string DeviceAllocator::check_pools_locked() const {
  std::vector<PoolState> recount(1);
  for (const auto& [addr, b] : placement_.index().blocks()) {
    if (b.pool == kDefaultPool) continue;
    if (!pools_.at(b.pool).in_use()) {
      return "block at " + hex(addr) + " belongs to pool slot " + std::to_string(b.pool) +
             ", which holds no pool";
    }
    const PoolState& p = pools_.at(b.pool);
    if (b.state == BlockState::asleep && !p.asleep) {
      return "block at " + hex(addr) + " is asleep, but pool " + std::to_string(p.id) + " is not";
    }
    if (b.state == BlockState::live && p.asleep) {
      return "block at " + hex(addr) + " is live, but pool " + std::to_string(p.id) + " sleeps";
    }
    if (b.state != BlockState::live && b.state != BlockState::asleep && p.returned) {
      return "free block at " + hex(addr) + " still belongs to returned pool " +
             std::to_string(p.id);
    }
    if (recount.size() <= b.pool) recount.resize(size_t{b.pool} + 1);
    if (b.state == BlockState::live || b.state == BlockState::asleep) {
      ++recount[b.pool].live_blocks;
      recount[b.pool].requested_bytes += b.requested;
      recount[b.pool].allocated_bytes += b.size;
    } else if (b.state == BlockState::free && p.use_count > 0 && !p.asleep) {
      const Reservation& r = placement_.res(b.res);
      if (!r.all_ready(r.first_page(addr), r.last_page(addr, b.size))) {
        return "free block at " + hex(addr) + " of pool " + std::to_string(p.id) +
               " (in use) has pages unmapped or not accessible";
      }
    }
  }
  std::string err;
  pools_.for_each([&](PoolSlot s, const PoolState& p) {
    const PoolState c = s < recount.size() ? recount[s] : PoolState{};
    if (err.empty() && (c.live_blocks != p.live_blocks || c.requested_bytes != p.requested_bytes ||
                        c.allocated_bytes != p.allocated_bytes)) {
      err = "pool " + std::to_string(p.id) + " books " + std::to_string(p.live_blocks) +
            " live blocks / " + std::to_string(p.allocated_bytes) + " bytes, recounted " +
            std::to_string(c.live_blocks) + " / " + std::to_string(c.allocated_bytes);
    }
  });
  return err;
}

}  // namespace expanse::core
