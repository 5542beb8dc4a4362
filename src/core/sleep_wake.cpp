// Sleep and wake of a pool: its pages go back to the driver while its addresses and blocks stay,
// and come back at the same addresses, so pointers (and CUDA graphs captured over them) stay
// valid across a cycle.
//
// Sleep: synchronize the device's context (every stream's work on the pool done, replays of its
// graphs included), copy live blocks to pinned host staging (offload), mark them asleep (no
// longer touched), unmap the pool's handles, release them. Wake: map pages under every block of
// the pool again (the usual page supply: pooled, new, reclaimed from the default pool's free
// memory), mark the blocks live, copy the bytes back. A failure on the way undoes what was done.
#include "core/streams/capture_announcements.hpp"
#include "core/base/check.hpp"
#include "core/pools/copy_runs.hpp"
#include "core/device_allocator.hpp"
#include "core/base/format.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <chrono>
#include <map>

namespace expanse::core {

namespace {

// What one sleep or wake costs: the driver time the cost model prices, and the wall time.
class CycleClock {
 public:
  explicit CycleClock(const DeviceDriver& drv)
      : drv_(drv), modeled0_(drv.modeled_ns()), wall0_(std::chrono::steady_clock::now()) {}
  // The figures so far into *modeled_ns and *wall_ns.
  void read(double* modeled_ns, uint64_t* wall_ns) const {
    *modeled_ns = drv_.modeled_ns() - modeled0_;
    *wall_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - wall0_)
                                         .count());
  }

 private:
  const DeviceDriver& drv_;
  double modeled0_;
  std::chrono::steady_clock::time_point wall0_;
};

}  // namespace

std::vector<ReclaimableHandle> DeviceAllocator::sleeping_handles(PoolSlot s) const {
  // Per reservation holding a block of the pool: pages a block of it overlaps, and pages that
  // must stay mapped for others (a live or pending block of any other pool, a free block of
  // another pool in use, or one whose streams may still use it).
  std::map<uint32_t, std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> pages;
  const BlockMap& blocks = placement_.index().blocks();
  for (const auto& [addr, b] : blocks) {
    if (b.pool == s) {
      const Reservation& r = placement_.res(b.res);
      pages.emplace(b.res, std::make_pair(std::vector<uint8_t>(r.page_count(), 0),
                                          std::vector<uint8_t>(r.page_count(), 0)));
    }
  }
  for (const auto& [addr, b] : blocks) {
    auto pr = pages.find(b.res);
    if (pr == pages.end()) continue;
    const Reservation& r = placement_.res(b.res);
    const bool mine = b.pool == s;
    const bool harmless = b.pool == kDefaultPool && b.state == BlockState::free && b.safe;
    if (!mine && harmless) continue;
    auto& marks = mine ? pr->second.first : pr->second.second;
    for (size_t i = r.first_page(addr); i <= r.last_page(addr, b.size); ++i) marks[i] = 1;
  }
  std::vector<ReclaimableHandle> out;
  for (const auto& [res, marks] : pages) {
    const Reservation& r = placement_.res(res);
    for (const HandleRun& h : r.handles_in(0, r.page_count())) {
      bool ok = true;
      for (size_t i = h.head; i < h.end() && ok; ++i) ok = marks.first[i] != 0 && marks.second[i] == 0;
      if (ok) out.push_back({h.pages, res, h.head});
    }
  }
  return out;
}

bool DeviceAllocator::sleep_pool(PoolId id, SleepMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "pool_sleep");
  const PoolSlot s = pools_.find(id, "pool_sleep", device(), true);
  PoolState& p = pools_.at(s);
  if (p.asleep) {
    throw usage_error("expanse: pool_sleep: " + pool_name(id, device()) +
                      " is asleep already; nothing was changed");
  }
  if (p.registrable) {
    // Its handles may be exported to other processes or registered with NICs: giving their
    // pages back would leave importers and registrations on memory the pool no longer has.
    const RegistrableBlocks::PoolFigures f = registrable_.of_pool(id);
    throw usage_error("expanse: pool_sleep: " + pool_name(id, device()) +
                      " is registrable (" + std::to_string(f.blocks) + " live block" +
                      (f.blocks == 1 ? "" : "s") + (f.exported ? ", some exported" : "") +
                      "): its memory may be mapped by other processes or registered with NICs, "
                      "so it cannot sleep; nothing was changed");
  }
  flush_caches_locked();  // parked default blocks give back their share of the pool's edge pages
  BlockIndex& index = placement_.index();
  const CycleClock clock(drv_);
  try {
    // Whatever may still use the pool's memory (its streams, its graphs' replays) is done only
    // when the context is: a synchronize, never under an announced capture.
    if (!streams_.sync_context(drv_.primary())) return false;
    streams_.poll(false);
    std::vector<BlockIt> live;
    size_t total = 0;
    for (auto it = index.blocks().begin(); it != index.blocks().end(); ++it) {
      const Block& b = it->second;
      if (b.pool != s) continue;
      if (b.state == BlockState::pending || (b.state == BlockState::free && !b.safe)) {
        throw usage_error("expanse: pool_sleep: " + pool_name(id, device()) + ": the block at " +
                          hex(it->first) +
                          " was freed on a stream of another context whose work cannot be "
                          "proven done; nothing was changed");
      }
      if (b.state == BlockState::live) {
        live.push_back(it);
        total += b.size;
      }
    }
    // 1. Offload: every live block's bytes (as carved, so adjacent blocks make one run) to pinned
    // staging that is kept across cycles.
    std::vector<std::pair<CUdeviceptr, size_t>> saved;
    if (mode == SleepMode::offload && total != 0) {
      if (p.backup_bytes < total) {
        free_backup(p.backup);
        p.backup = nullptr;
        p.backup_bytes = 0;
        p.backup = alloc_backup(total);
        p.backup_bytes = total;
      }
      if (copy_stream_ == nullptr) copy_stream_ = drv_.create_copy_stream();
      char* staging = static_cast<char*>(p.backup);
      auto issue = [&](CUdeviceptr addr, size_t off, size_t bytes) {
        drv_.copy_to_host(staging + off, addr, bytes, copy_stream_);
      };
      CopyRuns<decltype(issue)> runs(issue);
      size_t off = 0;
      for (BlockIt it : live) {
        runs.add(it->first, off, it->second.size);
        saved.emplace_back(it->first, off);
        off += it->second.size;
      }
      runs.flush();
      drv_.stream_synchronize(copy_stream_);
    } else {
      for (BlockIt it : live) saved.emplace_back(it->first, 0);
    }
    // 2. The live blocks stop being touched; 3. the pool's pages are unmapped and released.
    for (BlockIt it : live) {
      supply_.untouch(placement_.res(it->second.res), it->first, it->second.size);
      it->second.state = BlockState::asleep;
    }
    p.asleep = true;
    p.offloaded = mode == SleepMode::offload;
    p.zero_on_wake = mode == SleepMode::discard_zeroed;
    p.saved = std::move(saved);
    const std::vector<ReclaimableHandle> going = sleeping_handles(s);
    size_t released = 0;
    for (const ReclaimableHandle& h : going) released += h.pages * page_;
    try {
      supply_.give_back(going);
    } catch (const driver::driver_error& e) {
      // Some pages did not go: the pool wakes as it was (its bytes are in the staging when
      // offloaded; discarded content was given up by the caller already).
      try {
        wake_locked(s);
      } catch (...) {
        throw driver_failure("expanse: pool_sleep of " + pool_name(id, device()) + ": " +
                                 e.what() + "; waking it again failed too: the pool is asleep" +
                                 (p.offloaded ? ", with its bytes in host memory" : "") +
                                 " (pool_wake may succeed later)",
                             static_cast<int>(e.code()));
      }
      throw;
    }
    p.cycles.sleeps += 1;
    p.cycles.released_bytes = released;
    clock.read(&p.cycles.sleep_modeled_ns, &p.cycles.sleep_wall_ns);
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: pool_sleep of " + pool_name(id, device()) + ": " + e.what() +
                             "; the pool is awake",
                         static_cast<int>(e.code()));
  }
  return true;
}

void DeviceAllocator::wake_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckedScope checked(*this, "pool_wake");
  // A released pool may still be woken: its live blocks stay valid, and their bytes are in its
  // backup.
  const PoolSlot s = pools_.find(id, "pool_wake", device(), false);
  if (!pools_.at(s).asleep) {
    throw usage_error("expanse: pool_wake: " + pool_name(id, device()) +
                      " is awake; nothing was changed");
  }
  const CycleClock clock(drv_);
  try {
    // Parked blocks hold touched pages that the wake's page search cannot reclaim.
    flush_caches_locked();
    wake_locked(s);
    PoolState& p = pools_.at(s);
    clock.read(&p.cycles.wake_modeled_ns, &p.cycles.wake_wall_ns);
  } catch (const driver::driver_error& e) {
    throw driver_failure("expanse: pool_wake of " + pool_name(id, device()) + ": " + e.what() +
                             "; the pool is still asleep, with its backup",
                         static_cast<int>(e.code()));
  }
}

void DeviceAllocator::wake_locked(PoolSlot s) {
  PoolState& p = pools_.at(s);
  BlockIndex& index = placement_.index();
  // The pool's blocks as ranges, not iterators: a poll while pages are found (ensure_pages) may
  // merge its free blocks, erasing some. A merge only joins the pool's own free ranges, so each
  // range is still the pool's memory to map. Asleep blocks are never merged: iterators serve.
  struct Range {
    CUdeviceptr addr;
    size_t size;
    uint32_t res;
    bool asleep;
  };
  std::vector<Range> mine;
  std::vector<BlockIt> waking;
  for (auto it = index.blocks().begin(); it != index.blocks().end(); ++it) {
    if (it->second.pool != s) continue;
    const bool asleep = it->second.state == BlockState::asleep;
    mine.push_back({it->first, it->second.size, it->second.res, asleep});
    if (asleep) waking.push_back(it);
  }
  // Where each asleep block's bytes are in the staging (blocks freed while asleep have none).
  std::map<CUdeviceptr, size_t> staged;
  if (p.offloaded) staged.insert(p.saved.begin(), p.saved.end());
  const bool fill = p.offloaded || p.zero_on_wake;
  if (fill && copy_stream_ == nullptr) copy_stream_ = drv_.create_copy_stream();
  bool copies_issued = false;
  // Undoes a partial wake: copies under way finish, the blocks are asleep again, the pages
  // mapped for them are given back.
  auto undo = [&] {
    if (copies_issued) {
      try {
        drv_.stream_synchronize(copy_stream_);
      } catch (...) {
        // A failed stream: its copies did not run; the pages may go.
      }
    }
    for (BlockIt it : waking) {
      if (it->second.state == BlockState::live) {
        supply_.untouch(placement_.res(it->second.res), it->first, it->second.size);
        it->second.state = BlockState::asleep;
      }
    }
    try {
      supply_.give_back(sleeping_handles(s));
    } catch (...) {
      // Pages that did not go stay mapped under asleep blocks: counted, released later.
    }
  };
  // Free memory one page per handle, as a pool's memory is mapped (place_once): a live pool's
  // handles are never split, so only these let it place any block there again. A live block
  // gets the handles any block gets (fewer, larger: a weights pool wakes, and sleeps again, at a
  // fraction of the driver calls); once freed, its memory serves blocks that cover them whole.
  auto map_block = [&](const Range& r, PageRequest& req) {
    return supply_.ensure_pages(placement_.res(r.res), r.addr, r.size, req, r.asleep ? 0 : 1);
  };
  // A block's bytes go back (or its zeros) as soon as its pages are mapped, so the copy engine
  // works while the next blocks are mapped.
  const char* staging = static_cast<const char*>(p.backup);
  auto issue = [&](CUdeviceptr addr, size_t off, size_t bytes) {
    copies_issued = true;
    if (p.offloaded) {
      drv_.copy_to_device(addr, staging + off, bytes, copy_stream_);
    } else {
      drv_.zero(addr, bytes, copy_stream_);
    }
  };
  CopyRuns<decltype(issue)> runs(issue);
  try {
    PageRequest req;
    for (const Range& r : mine) {
      req.bytes = r.size;
      if (!map_block(r, req)) {
        undo();
        throw out_of_memory("expanse: waking pool " + std::to_string(p.id) + " on device " +
                                std::to_string(device()) + ": the pages under its block at " +
                                hex(r.addr) + " (" + conf::format_size(r.size) +
                                ") cannot be had; the pool is still asleep" +
                                pools_holding_memory(),
                            r.size, device());
      }
      if (!fill || !r.asleep) continue;
      if (p.offloaded) {
        auto st = staged.find(r.addr);
        if (st != staged.end()) runs.add(r.addr, st->second, r.size);
      } else {
        // Zeroing needs no staging: one offset line keeps adjacent blocks in one run.
        runs.add(r.addr, r.addr, r.size);
      }
    }
    runs.flush();
    if (copies_issued) drv_.stream_synchronize(copy_stream_);
    for (BlockIt it : waking) {
      supply_.touch(placement_.res(it->second.res), it->first, it->second.size);
      it->second.state = BlockState::live;
    }
  } catch (const driver::driver_error&) {
    undo();
    throw;
  }
  p.asleep = false;
  p.offloaded = false;
  p.zero_on_wake = false;
  p.saved.clear();
}

bool DeviceAllocator::pool_is_asleep(PoolId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pools_.at(pools_.find(id, "pool_is_asleep", device(), false)).asleep;
}

size_t DeviceAllocator::release_host_backup() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t freed = 0;
  CaptureAnnouncements::run_unless_capturing(drv_.primary(), [&] {
    free_orphan_backups_locked();
    pools_.for_each([&](PoolSlot s, const PoolState& st) {
      if (st.asleep || st.backup == nullptr) return;
      PoolState& p = pools_.at(s);
      free_backup(p.backup);
      freed += p.backup_bytes;
      p.backup = nullptr;
      p.backup_bytes = 0;
    });
    return true;
  });
  return freed;
}

void DeviceAllocator::free_orphan_backups_locked() {
  for (void* b : orphan_backups_) free_backup(b);
  orphan_backups_.clear();
}

void* DeviceAllocator::alloc_backup(size_t bytes) {
  if (host_staging_ != nullptr) {
    if (void* p = host_staging_->stage(bytes, device())) return p;
  }
  return drv_.host_alloc(bytes);
}

void DeviceAllocator::free_backup(void* p) noexcept {
  if (p == nullptr) return;
  if (host_staging_ != nullptr && host_staging_->unstage(p)) return;
  drv_.free_host(p);
}

void DeviceAllocator::set_host_staging(HostStaging* staging) {
  std::lock_guard<std::mutex> lock(mu_);
  host_staging_ = staging;
}

}  // namespace expanse::core
