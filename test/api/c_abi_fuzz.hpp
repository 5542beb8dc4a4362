// The whole C ABI driven by a stream of choices: sequences of every public entry point (pinned
// host memory's included) with
// valid and invalid arguments (freed, interior, foreign pointers; wrong sizes, devices and
// streams; destroyed pools; blocks of a sleeping pool; closed imports), with driver failures
// injected at random calls, against a reference model of what each thread holds. After every
// call the model checks what the call answered (a misuse gets EXPANSE_EINVAL and a message
// naming it), the books (one thread: the device's requested bytes and live blocks), and the
// bytes of the blocks the call could have touched; every block's bytes at intervals and at the
// end. The choices come from a seeded generator (the unit tests, one thread and four) or from
// libFuzzer's bytes (test/fuzz/fuzz_c_abi.cpp). A violation is recorded, never thrown: each
// caller decides how to fail.
#pragma once

#include "driver_api/entry_points.hpp"
#include "fuzz_choices.hpp"
#include "expanse/expanse.h"
#include "sim/sim.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace expanse::test::fuzz {

// The configuration the fuzzer runs under: two sim devices, small enough that limits and
// reservations bite, with POSIX fds for in-process export and import.
inline const char* fuzz_conf() {
  return "driver:sim,sim_devices:2,sim_capacity:1GiB,sim_posix_fd:true";
}
constexpr size_t kFuzzCapacity = size_t{1} << 30;

class CAbiFuzzer {
 public:
  // thread: which of the threads this is (its blocks' patterns differ); alone: no other thread
  // uses expanse meanwhile, so the device-wide books must equal this model's.
  // faults: some thread injects driver failures, so any call may answer EXPANSE_EDRIVER (with
  // other threads, at any time; alone, while this one's injections are armed).
  CAbiFuzzer(int thread, bool alone, bool faults)
      : thread_(thread), alone_(alone), faults_(faults), injecting_(faults && !alone) {}
  ~CAbiFuzzer() { finish(); }

  const std::vector<std::string>& failures() const { return failures_; }
  size_t operations() const { return ops_; }

  void run(Choices& c, size_t max_ops) {
    for (size_t i = 0; i < max_ops && !c.done() && failures_.size() < 20; ++i) step(c);
  }

  // Frees what is live, closes imports, ends routes and releases pools: nothing is left to the
  // next run (or to expanse_shutdown).
  void finish() {
    if (alone_) {
      sim::clear_injections();
      injecting_ = false;
    }
    for (size_t i = 0; i < imports_.size(); ++i) {
      if (expanse_ipc_close(imports_[i].ptr) != EXPANSE_OK) {
        fail("closing import " + hex(imports_[i].ptr) + ": " + expanse_last_error());
      }
    }
    imports_.clear();
    for (const HostBlock& h : host_blocks_) {
      if (!holds(h.ptr, h.size, h.seed)) fail("host block " + hex(h.ptr) + " lost its bytes");
      if (expanse_host_free(h.ptr, nullptr) != EXPANSE_OK) {
        fail("freeing host block " + hex(h.ptr) + ": " + expanse_last_error());
      }
    }
    host_blocks_.clear();
    for (int d = 0; d < 2; ++d) {  // room for the wakes
      expanse_unreserve(d);
      expanse_set_limit(d, SIZE_MAX);
      expanse_release_cached(d);
    }
    // The blocks of awake pools go first: a sleeping pool's wake may need their memory.
    check_all();
    free_blocks([this](const Block& b) { return !asleep(b.pool); });
    for (int d = 0; d < 2; ++d) expanse_release_cached(d);
    for (Pool& p : pools_) {
      if (p.asleep) {
        if (expanse_pool_wake(p.id, nullptr) != EXPANSE_OK) {
          // Injections are cleared only for a lone thread; try again once they are gone.
          // Several sleeping pools' blocks, free ones included, may not fit the device together:
          // out of memory is an answer; its blocks are then freed unread, asleep.
          const int rc = expanse_pool_wake(p.id, nullptr);
          if (rc != EXPANSE_OK) {
            if (rc != EXPANSE_ENOMEM) {
              fail("waking pool " + std::to_string(p.id) + ": " + expanse_last_error());
            }
            continue;
          }
        }
        p.asleep = false;
      }
    }
    check_all();
    free_blocks([](const Block&) { return true; });
    while (routes_ > 0) {
      expanse_pool_end(route_pool_);
      --routes_;
    }
    for (Pool& p : pools_) {
      for (int i = 0; i < p.uses; ++i) expanse_pool_release(p.id);
    }
    pools_.clear();
    if (alone_) {
      for (int d = 0; d < 2; ++d) {
        const expanse_stats s = stats(d);
        if (s.requested_bytes != 0) {
          fail("device " + std::to_string(d) + ": " + std::to_string(s.requested_bytes) +
               " bytes still requested with no block live");
        }
      }
    }
  }

 private:
  struct Block {
    void* ptr;
    size_t size;
    int device;
    uint64_t seed;
    uint64_t pool;  // 0: the default pool
  };
  struct Pool {
    uint64_t id;
    int device;
    bool registrable;
    int uses;  // this thread's retains (0: released)
    bool asleep;
  };
  struct HostBlock {
    void* ptr;
    size_t size;
    uint64_t seed;
  };
  struct Import {
    void* ptr;
    size_t size;
    uint64_t seed;
    const void* source;
  };

  static std::string hex(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
  }
  void fail(const std::string& what) {
    failures_.push_back("thread " + std::to_string(thread_) + ", operation " +
                        std::to_string(ops_) + ": " + what);
  }
  // A call that must be refused as misuse: EXPANSE_EINVAL and a message naming `names`.
  void expect_refused(int rc, const std::string& call, const std::string& names) {
    if (rc != EXPANSE_EINVAL) {
      fail(call + " answered " + std::to_string(rc) + ", not EXPANSE_EINVAL");
      return;
    }
    const std::string m = expanse_last_error();
    if (!names.empty() && m.find(names) == std::string::npos) {
      fail(call + ": the message does not name " + names + ": " + m);
    }
  }
  // A call that may fail only for lack of memory (when out_of_memory may be) or an injected
  // driver failure.
  bool ok_or_fault(int rc, const std::string& call, bool out_of_memory = true) {
    if (rc == EXPANSE_OK) return true;
    // An injected CUDA_ERROR_OUT_OF_MEMORY reads as ENOMEM anywhere.
    if ((rc == EXPANSE_ENOMEM && (out_of_memory || injecting_)) ||
        (rc == EXPANSE_EDRIVER && injecting_)) {
      if (std::strlen(expanse_last_error()) == 0) fail(call + " failed without a message");
      return false;
    }
    fail(call + " answered " + std::to_string(rc) + ": " + expanse_last_error());
    return false;
  }
  static expanse_stats stats(int device) {
    expanse_stats s{};
    s.struct_size = sizeof s;
    expanse_get_stats(device, &s);
    return s;
  }

  // A block's pattern: a word at a few places (its ends and a middle), cheap to write and check.
  static size_t spots(size_t size, size_t* at) {
    size_t n = 0;
    at[n++] = 0;
    if (size >= 16) at[n++] = size - 8;
    if (size >= 64) at[n++] = size / 2 & ~size_t{7};
    return n;
  }
  static uint64_t word(uint64_t seed, size_t i) { return seed * 0x9E3779B97F4A7C15ull + i; }
  static void fill(void* p, size_t size, uint64_t seed) {
    size_t at[3];
    const size_t n = spots(size, at);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t w = word(seed, i);
      std::memcpy(static_cast<char*>(p) + at[i], &w, std::min<size_t>(8, size));
    }
  }
  static bool holds(const void* p, size_t size, uint64_t seed) {
    size_t at[3];
    const size_t n = spots(size, at);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t w = word(seed, i);
      if (std::memcmp(static_cast<const char*>(p) + at[i], &w, std::min<size_t>(8, size)) != 0) {
        return false;
      }
    }
    return true;
  }
  int pool_device(uint64_t pool) const {
    for (const Pool& p : pools_) {
      if (p.id == pool) return p.device;
    }
    return -1;
  }
  bool asleep(uint64_t pool) const {
    for (const Pool& p : pools_) {
      if (p.id == pool) return p.asleep;
    }
    return false;
  }
  void check(const Block& b) {
    if (asleep(b.pool)) return;  // its pages are gone until the wake
    if (!holds(b.ptr, b.size, b.seed)) fail("block " + hex(b.ptr) + " lost its bytes");
  }
  void check_all() {
    for (const Block& b : blocks_) check(b);
    for (const Import& i : imports_) {
      if (!holds(i.ptr, i.size, i.seed)) fail("import " + hex(i.ptr) + " lost its bytes");
    }
    for (const HostBlock& h : host_blocks_) {
      if (!holds(h.ptr, h.size, h.seed)) fail("host block " + hex(h.ptr) + " lost its bytes");
    }
  }
  void check_books() {
    if (!alone_) return;
    for (int d = 0; d < 2; ++d) {
      uint64_t requested = 0;
      for (const Block& b : blocks_) requested += b.device == d ? b.size : 0;
      const expanse_stats s = stats(d);
      if (s.requested_bytes != requested) {
        fail("device " + std::to_string(d) + " reports " + std::to_string(s.requested_bytes) +
             " bytes requested, the model " + std::to_string(requested));
      }
    }
  }

  size_t size_of(Choices& c) {
    switch (c.pick(4)) {
      case 0: return 1 + c.pick(4096);
      case 1: return 4096 + c.pick(1 << 20);
      case 2: return (1 << 20) + c.pick(16 << 20);
      default: return (16 << 20) + c.pick(200 << 20);
    }
  }
  static CUstream_st* stream_of(Choices& c) {
    switch (c.pick(3)) {
      case 0: return nullptr;
      case 1: return reinterpret_cast<CUstream_st*>(uintptr_t{1});  // CU_STREAM_LEGACY
      default: return reinterpret_cast<CUstream_st*>(uintptr_t{2});  // CU_STREAM_PER_THREAD
    }
  }
  void add(void* p, size_t size, int device, uint64_t pool) {
    const uint64_t seed = (static_cast<uint64_t>(thread_) << 48) ^ ++serial_;
    fill(p, size, seed);
    blocks_.push_back({p, size, device, seed, pool});
  }
  Pool* pool_of(Choices& c) {
    if (pools_.empty()) return nullptr;
    return &pools_[c.pick(pools_.size())];
  }

  void step(Choices& c) {
    ++ops_;
    const uint64_t op = c.pick(27);
    switch (op) {
      case 0: case 1: case 2: case 3: malloc_one(c); break;
      case 4: case 5: case 6: free_one(c); break;
      case 7: free_wrongly(c); break;
      case 8: record_stream(c); break;
      case 9: release_cached(c); break;
      case 10: limit(c); break;
      case 11: reserve(c); break;
      case 12: stats_call(c); break;
      case 13: pool_create(c); break;
      case 14: pool_malloc(c); break;
      case 15: pool_use(c); break;
      case 16: pool_sleep(c); break;
      case 17: pool_route(c); break;
      case 18: history(c); break;
      case 19: share(c); break;
      case 20: close_import(c); break;
      case 21: inject(c); break;
      case 22: pool_of_call(c); break;
      case 24: more(c); break;
      case 25: case 26: host(c); break;
      default: misuse(c); break;
    }
    check_books();
    if (ops_ % 64 == 0) check_all();
  }

  void malloc_one(Choices& c) {
    const size_t size = size_of(c);
    const int device = static_cast<int>(c.pick(2));
    void* p = nullptr;
    const int rc = expanse_malloc_checked(&p, size, device, stream_of(c));
    if (routes_ > 0 && asleep(route_pool_) && pool_device(route_pool_) == device) {
      const std::string id = std::to_string(route_pool_);  // routed into a sleeping pool
      if (rc != EXPANSE_OK) {
        expect_refused(rc, "malloc routed to sleeping pool " + id, id);
        return;
      }
    }
    if (!ok_or_fault(rc, "expanse_malloc_checked(" + std::to_string(size) + ")")) {
      if (p != nullptr) fail("a failed malloc gave a pointer");
      return;
    }
    if (p == nullptr) {
      fail("malloc of " + std::to_string(size) + " answered OK and NULL");
      return;
    }
    // A route of this thread may have put it in a pool.
    expanse_pool_id pool = 0;
    if (expanse_pool_of(p, &pool) != EXPANSE_OK) fail("expanse_pool_of(" + hex(p) + ") refused");
    add(p, size, device, pool);
  }

  void free_one(Choices& c) {
    if (blocks_.empty()) return;
    const size_t k = c.pick(blocks_.size());
    const Block b = blocks_[k];
    check(b);
    for (const Import& i : imports_) {
      if (i.source == b.ptr) return;  // kept while imported: its import's bytes are checked
    }
    const int rc = expanse_free_checked(b.ptr, c.pick(2) ? b.size : 0, b.device, stream_of(c));
    if (rc != EXPANSE_OK) {
      ok_or_fault(rc, "freeing live " + hex(b.ptr), false);
      return;  // still live
    }
    blocks_[k] = blocks_.back();
    blocks_.pop_back();
    freed_.push_back(b.ptr);
    if (freed_.size() > 64) freed_.erase(freed_.begin());
  }

  template <typename Which>
  void free_blocks(Which which) {
    std::vector<Block> kept;
    for (const Block& b : blocks_) {
      if (!which(b)) {
        kept.push_back(b);
      } else if (expanse_free_checked(b.ptr, b.size, b.device, nullptr) != EXPANSE_OK &&
                 expanse_free_checked(b.ptr, b.size, b.device, nullptr) != EXPANSE_OK) {
        fail("freeing " + hex(b.ptr) + " at the end: " + expanse_last_error());
      }
    }
    blocks_.swap(kept);
  }

  bool is_live_start(const void* p) const {
    for (const Block& b : blocks_) {
      if (b.ptr == p) return true;
    }
    return false;
  }

  // Each misuse of expanse_free changes nothing: refused, named, and every block intact.
  void free_wrongly(Choices& c) {
    const expanse_stats before = stats(0);
    const int kind = static_cast<int>(c.pick(5));
    if (kind == 0 && !freed_.empty()) {
      void* p = freed_[c.pick(freed_.size())];
      if (is_live_start(p) || !alone_) return;  // reused since (or maybe, by another thread)
      expect_refused(expanse_free_checked(p, 0, 0, nullptr), "double free of " + hex(p), hex(p));
    } else if (kind == 1 && !blocks_.empty()) {
      const Block& b = blocks_[c.pick(blocks_.size())];
      if (b.size < 1024) return;
      void* p = static_cast<char*>(b.ptr) + 512;
      expect_refused(expanse_free_checked(p, 0, b.device, nullptr), "interior free " + hex(p),
                     hex(p));
    } else if (kind == 2) {
      int local = 0;
      expect_refused(expanse_free_checked(&local, 4, 0, nullptr), "foreign free", hex(&local));
    } else if (kind == 3 && !blocks_.empty()) {
      const Block& b = blocks_[c.pick(blocks_.size())];
      expect_refused(expanse_free_checked(b.ptr, b.size, 1 - b.device, nullptr),
                     "free on the wrong device of " + hex(b.ptr), hex(b.ptr));
    } else if (kind == 4 && !blocks_.empty()) {
      const Block& b = blocks_[c.pick(blocks_.size())];
      expect_refused(expanse_free_checked(b.ptr, b.size + 1 + c.pick(4096), b.device, nullptr),
                     "free with the wrong size of " + hex(b.ptr), hex(b.ptr));
    }
    if (alone_ && stats(0).num_frees != before.num_frees) fail("a refused free counted as one");
  }

  void record_stream(Choices& c) {
    if (!blocks_.empty() && c.pick(2) == 0) {
      const Block& b = blocks_[c.pick(blocks_.size())];
      const int rc = expanse_record_stream(b.ptr, stream_of(c));
      if (asleep(b.pool)) {
        expect_refused(rc, "record_stream on a sleeping pool's block", "");
      } else {
        ok_or_fault(rc, "expanse_record_stream(" + hex(b.ptr) + ")");
      }
    } else {
      int local = 0;
      expect_refused(expanse_record_stream(&local, nullptr), "record_stream of a foreign pointer",
                     hex(&local));
    }
  }

  void release_cached(Choices& c) {
    const int device = static_cast<int>(c.pick(3)) - (c.pick(8) == 0 ? 5 : 0);
    const int rc = expanse_release_cached(device);
    if (device < 0 || device > 1) {
      expect_refused(rc, "release_cached(" + std::to_string(device) + ")", std::to_string(device));
    } else {
      ok_or_fault(rc, "expanse_release_cached");
    }
  }

  void limit(Choices& c) {
    const int device = static_cast<int>(c.pick(2));
    const size_t bytes = c.pick(3) == 0 ? SIZE_MAX : kFuzzCapacity / 8 * (1 + c.pick(8));
    const int rc = expanse_set_limit(device, bytes);
    if (rc != EXPANSE_OK && rc != EXPANSE_EINVAL) ok_or_fault(rc, "expanse_set_limit");
    if (rc == EXPANSE_EINVAL && std::strlen(expanse_last_error()) == 0) {
      fail("a refused limit without a message");
    }
  }

  void reserve(Choices& c) {
    const int device = static_cast<int>(c.pick(2));
    if (c.pick(3) == 0) {
      ok_or_fault(expanse_unreserve(device), "expanse_unreserve");
      return;
    }
    const size_t bytes = c.pick(4) == 0 ? EXPANSE_RESERVE_FREE : (kFuzzCapacity / 16) * c.pick(20);
    size_t got = 0;
    const int rc = expanse_reserve(device, bytes, &got);
    if (rc == EXPANSE_EINVAL) {
      if (alone_ && bytes != EXPANSE_RESERVE_FREE && bytes != 0 && bytes <= kFuzzCapacity / 2) {
        // Only above the limit (at most half the device under limit()) or the capacity; with
        // other threads, the limit may have changed since.
        const expanse_stats s = stats(device);
        if (bytes <= s.limit_bytes) fail("reserve(" + std::to_string(bytes) + ") refused: " +
                                         expanse_last_error());
      }
      return;
    }
    if (ok_or_fault(rc, "expanse_reserve") && alone_ && bytes != EXPANSE_RESERVE_FREE) {
      const expanse_stats s = stats(device);
      if (s.reserved_bytes != got) fail("reserved_bytes differs from what reserve answered");
      if (s.physical_low_water_bytes < s.reserved_bytes && s.physical_bytes >= s.reserved_bytes) {
        fail("low water below the reservation just made");
      }
    }
  }

  void stats_call(Choices& c) {
    expanse_stats s{};
    s.struct_size = sizeof s;
    const int device = c.pick(6) == 0 ? 7 : static_cast<int>(c.pick(2));
    const int rc = expanse_get_stats(device, &s);
    if (device == 7) {
      expect_refused(rc, "get_stats(7)", "7");
    } else if (rc != EXPANSE_OK) {
      fail(std::string("expanse_get_stats: ") + expanse_last_error());
    } else if (s.physical_low_water_bytes < s.reserved_bytes && !injecting_ && alone_) {
      fail("the reservation dipped: low water " + std::to_string(s.physical_low_water_bytes) +
           " below " + std::to_string(s.reserved_bytes));
    }
    if (c.pick(4) == 0) expect_refused(expanse_get_stats(0, nullptr), "get_stats(NULL)", "");
    if (c.pick(8) == 0) ok_or_fault(expanse_reset_peak_stats(static_cast<int>(c.pick(2))),
                                    "expanse_reset_peak_stats");
  }

  void pool_create(Choices& c) {
    if (pools_.size() >= 6) return;
    const int device = static_cast<int>(c.pick(2));
    const bool registrable = c.pick(2) == 0;
    expanse_pool_id id = 0;
    const int rc = registrable ? expanse_pool_create_registrable(device, &id)
                               : expanse_pool_create(device, &id);
    if (ok_or_fault(rc, "expanse_pool_create")) pools_.push_back({id, device, registrable, 1, false});
  }

  void pool_malloc(Choices& c) {
    Pool* p = pool_of(c);
    if (p == nullptr) return;
    const size_t size = size_of(c);
    void* q = expanse_pool_malloc(p->id, size, nullptr);
    if (p->uses == 0 || p->asleep) {
      if (q != nullptr) {
        fail("pool_malloc into pool " + std::to_string(p->id) +
             (p->asleep ? " asleep" : " released") + " succeeded");
        add(q, size, p->device, p->id);
      } else if (std::string(expanse_last_error()).find(std::to_string(p->id)) ==
                 std::string::npos) {
        fail("pool_malloc's refusal does not name pool " + std::to_string(p->id) + ": " +
             expanse_last_error());
      }
      return;
    }
    if (q == nullptr) {
      if (std::strlen(expanse_last_error()) == 0) fail("pool_malloc failed without a message");
      return;
    }
    add(q, size, p->device, p->id);
  }

  void pool_use(Choices& c) {
    Pool* p = pool_of(c);
    if (p == nullptr) return;
    const std::string id = std::to_string(p->id);
    switch (c.pick(3)) {
      case 0:
        if (p->uses == 0) {
          expect_refused(expanse_pool_retain(p->id), "retain of released pool " + id, id);
        } else if (ok_or_fault(expanse_pool_retain(p->id), "retain")) {
          ++p->uses;
        }
        break;
      case 1:
        if (p->uses == 0) {
          expect_refused(expanse_pool_release(p->id), "release of released pool " + id, id);
        } else if (route_pool_ == p->id && routes_ > 0) {
          return;  // its route first
        } else if (p->asleep) {
          return;  // a sleeping pool is woken before it goes (finish)
        } else if (ok_or_fault(expanse_pool_release(p->id), "release")) {
          --p->uses;
        }
        break;
      default: {
        const int rc = expanse_pool_trim(p->id);
        if (p->uses > 0) {
          expect_refused(rc, "trim of pool " + id + " in use", id);
        } else if (rc != EXPANSE_OK) {
          ok_or_fault(rc, "trim");
        }
      }
    }
  }

  void pool_sleep(Choices& c) {
    Pool* p = pool_of(c);
    if (p == nullptr || p->uses == 0) return;
    const std::string id = std::to_string(p->id);
    if (p->asleep) {
      const int rc = expanse_pool_wake(p->id, nullptr);
      if (ok_or_fault(rc, "wake of pool " + id)) {
        p->asleep = false;
        for (const Block& b : blocks_) {
          if (b.pool == p->id) check(b);  // offloaded: back with its bytes
        }
      } else if (expanse_pool_is_asleep(p->id) != 1) {
        fail("wake of pool " + id + " answered " + std::to_string(rc) + " but woke it: " +
             expanse_last_error());
      }
      return;
    }
    if (route_pool_ == p->id && routes_ > 0) return;  // this thread's allocations go there
    const int rc = expanse_pool_sleep(p->id, EXPANSE_SLEEP_OFFLOAD, nullptr);
    const std::string why = rc != EXPANSE_OK ? expanse_last_error() : "";
    // A sleep whose undo failed says so: the pool is asleep, its bytes in host memory.
    if (rc == EXPANSE_EDRIVER && injecting_ && why.find("the pool is asleep") != std::string::npos &&
        expanse_pool_is_asleep(p->id) == 1) {
      p->asleep = true;
      return;
    }
    if (rc != EXPANSE_OK && expanse_pool_is_asleep(p->id) != 0) {
      fail("sleep of pool " + id + " answered " + std::to_string(rc) + " (" + why +
           ") but the pool is asleep");
      p->asleep = true;
      return;
    }
    if (rc == EXPANSE_EBUSY && injecting_) {
      return;  // its context synchronize failed
    } else if (p->registrable) {
      expect_refused(rc, "sleep of registrable pool " + id, id);
    } else if (route_pool_ == p->id && routes_ > 0 && rc != EXPANSE_OK) {
      return;
    } else if (ok_or_fault(rc, "sleep of pool " + id)) {
      p->asleep = true;
      if (expanse_pool_is_asleep(p->id) != 1) fail("pool " + id + " asleep but says not");
    }
  }

  void pool_route(Choices& c) {
    if (routes_ > 0) {
      if (ok_or_fault(expanse_pool_end(route_pool_), "pool_end")) --routes_;
      return;
    }
    Pool* p = pool_of(c);
    if (p == nullptr) {
      expect_refused(expanse_pool_end(987654321), "end of no pool", "987654321");
      return;
    }
    const int rc = expanse_pool_begin_thread(p->id);
    if (p->uses == 0) {
      expect_refused(rc, "route to released pool", std::to_string(p->id));
    } else if (ok_or_fault(rc, "begin_thread")) {
      route_pool_ = p->id;
      ++routes_;
    }
  }

  void pool_of_call(Choices& c) {
    if (blocks_.empty()) return;
    const Block& b = blocks_[c.pick(blocks_.size())];
    expanse_pool_id id = 99;
    if (expanse_pool_of(b.ptr, &id) != EXPANSE_OK || id != b.pool) {
      fail("pool_of(" + hex(b.ptr) + ") is not its pool " + std::to_string(b.pool));
    }
    if (b.size >= 1024) {
      expect_refused(expanse_pool_of(static_cast<char*>(b.ptr) + 512, &id), "pool_of interior",
                     "");
    }
  }

  void history(Choices& c) {
    switch (c.pick(4)) {
      case 0:
        ok_or_fault(expanse_record_history(static_cast<int>(c.pick(2)), 16 + c.pick(256)),
                    "record_history");
        break;
      case 1: {
        size_t n = 0;
        const int device = static_cast<int>(c.pick(2));
        if (!ok_or_fault(expanse_get_trace(device, nullptr, &n), "get_trace")) break;
        std::vector<expanse_trace_entry> e(n + 4);
        size_t cap = e.size();
        ok_or_fault(expanse_get_trace(device, e.data(), &cap), "get_trace");
        break;
      }
      case 2: {
        size_t ns = 0, nb = 0;
        const int device = static_cast<int>(c.pick(2));
        if (!ok_or_fault(expanse_get_segments(device, nullptr, &ns, nullptr, &nb), "segments")) {
          break;
        }
        std::vector<expanse_segment_info> s(ns + 2);
        std::vector<expanse_block_info> b(nb + 2);
        ns = s.size();
        nb = b.size();
        if (ok_or_fault(expanse_get_segments(device, s.data(), &ns, b.data(), &nb), "segments") &&
            alone_) {
          size_t live = 0;
          for (size_t i = 0; i < std::min(nb, b.size()); ++i) {
            live += b[i].state == EXPANSE_BLOCK_LIVE ? 1 : 0;
          }
          size_t mine = 0;  // the default pool's (pools' blocks may lie in ranges of their own)
          for (const Block& k : blocks_) mine += k.device == device && k.pool == 0 ? 1 : 0;
          if (live < mine) {
            fail("segments show " + std::to_string(live) + " live blocks, the model " +
                 std::to_string(mine));
          }
        }
        break;
      }
      default:
        if (c.pick(16) == 0) {  // a file is written: now and then
          char path[] = "/tmp/expanse_fuzz_snapshot_XXXXXX";
          const int fd = mkstemp(path);
          if (fd < 0) break;
          close(fd);
          ok_or_fault(expanse_dump_snapshot(path), "dump_snapshot");
          unlink(path);
        } else {
          expect_refused(expanse_dump_snapshot("/nonexistent-dir/snap.pickle"),
                         "dump_snapshot to a missing folder", "/nonexistent-dir/snap.pickle");
        }
    }
  }

  // Export a registrable block and import it in this process: the same bytes at another address.
  void share(Choices& c) {
    std::vector<const Block*> registrable;
    for (const Block& b : blocks_) {
      for (const Pool& p : pools_) {
        if (p.id == b.pool && p.registrable) registrable.push_back(&b);
      }
    }
    expanse_ipc_handle h{};
    if (registrable.empty() || c.pick(4) == 0) {
      if (!blocks_.empty()) {
        const Block& b = blocks_[c.pick(blocks_.size())];
        bool reg = false;
        for (const Pool& p : pools_) reg = reg || (p.id == b.pool && p.registrable);
        if (!reg) {
          expect_refused(expanse_ipc_export(b.ptr, &h), "export of a plain block", hex(b.ptr));
        }
      }
      expect_refused(expanse_ipc_import(&h, 0, nullptr), "import of an empty handle", "");
      return;
    }
    const Block& b = *registrable[c.pick(registrable.size())];
    if (!ok_or_fault(expanse_ipc_export(b.ptr, &h), "export of " + hex(b.ptr))) return;
    if (expanse_ipc_handle_size(&h) != b.size) fail("the handle's size is not the block's");
    const int device = c.pick(5) == 0 ? 1 - b.device : b.device;
    void* q = nullptr;
    const int rc = expanse_ipc_import(&h, device, &q);
    if (device != b.device) {
      if (rc == EXPANSE_OK) {
        fail("import of device " + std::to_string(b.device) + "'s memory on device " +
             std::to_string(device) + " succeeded");
        imports_.push_back({q, b.size, b.seed, b.ptr});
      } else if (rc != EXPANSE_EINVAL) {
        ok_or_fault(rc, "import on the wrong device", false);
      }
    } else if (ok_or_fault(rc, "import")) {
      if (!holds(q, b.size, b.seed)) fail("import " + hex(q) + " of " + hex(b.ptr) + " differs");
      imports_.push_back({q, b.size, b.seed, b.ptr});
    }
    if (expanse_ipc_handle_release(&h) != EXPANSE_OK) fail("handle release");
    if (expanse_ipc_handle_release(&h) != EXPANSE_OK) fail("a second handle release");
    if (expanse_ipc_handle_size(&h) != 0) fail("a released handle has a size");
  }

  void close_import(Choices& c) {
    if (imports_.empty()) {
      int local = 0;
      expect_refused(expanse_ipc_close(&local), "close of an address not imported", hex(&local));
      return;
    }
    const size_t k = c.pick(imports_.size());
    const Import i = imports_[k];
    if (!holds(i.ptr, i.size, i.seed)) fail("import " + hex(i.ptr) + " lost its bytes");
    if (!ok_or_fault(expanse_ipc_close(i.ptr), "ipc_close")) return;
    imports_[k] = imports_.back();
    imports_.pop_back();
    // With other threads importing, the address may already be another thread's import.
    if (!alone_) return;
    expect_refused(expanse_ipc_close(i.ptr), "a second close of " + hex(i.ptr), hex(i.ptr));
  }

  void inject(Choices& c) {
    if (!faults_ || (!alone_ && thread_ != 0)) return;  // one thread plays the faulty driver
    if (c.pick(3) == 0) {
      sim::clear_injections();
      injecting_ = !alone_;
      return;
    }
    static constexpr driver::EntryPoint kPoints[] = {
        driver::EntryPoint::mem_create,          driver::EntryPoint::mem_map,
        driver::EntryPoint::mem_unmap,           driver::EntryPoint::mem_set_access,
        driver::EntryPoint::mem_release,         driver::EntryPoint::mem_address_reserve,
        driver::EntryPoint::event_record,        driver::EntryPoint::event_query,
        driver::EntryPoint::ctx_synchronize,     driver::EntryPoint::mem_get_info,
        driver::EntryPoint::mem_export_to_shareable_handle,
        driver::EntryPoint::mem_import_from_shareable_handle,
    };
    const driver::EntryPoint e = kPoints[c.pick(sizeof kPoints / sizeof kPoints[0])];
    const CUresult code = c.pick(2) == 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
    sim::inject_failure(e, 1 + c.pick(16), code);
    injecting_ = true;
  }

  // The entry points the other operations do not reach: the out-of-memory message, PyTorch's pair,
  // pool stats, filter routes, capture announcements, peers, wake hooks, host backups, names.
  void more(Choices& c) {
    switch (c.pick(9)) {
      case 0: {
        // The capacity goes in, the bytes needed come out; the message is written only whole.
        const int device = static_cast<int>(c.pick(2));
        const size_t cap = c.pick(2) == 0 ? 0 : 16 + c.pick(1024);
        std::vector<char> buf(cap + 1, 0);
        size_t size = cap;
        const int rc = expanse_format_oom(1 + c.pick(1 << 30), device, nullptr, "why",
                                          cap == 0 ? nullptr : buf.data(), &size);
        if (rc != EXPANSE_OK) {
          ok_or_fault(rc, "format_oom");
        } else if (size <= cap && std::strncmp(buf.data(), "CUDA out of memory", 18) != 0) {
          fail(std::string("format_oom wrote ") + buf.data());
        } else if (size > cap && buf[0] != 0) {
          fail("format_oom wrote a message its buffer could not hold whole");
        }
        expect_refused(expanse_format_oom(4096, 0, nullptr, nullptr, nullptr, nullptr),
                       "format_oom with a NULL size", "size");
        break;
      }
      case 1: {
        // PyTorch's pair: a failure throws (std::exception), a free goes by pointer and ignores
        // what is not live.
        const size_t size = size_of(c);
        const int device = static_cast<int>(c.pick(2));
        void* p = nullptr;
        try {
          p = expanse_torch_malloc(size, device, nullptr);
        } catch (const std::exception& e) {
          if (!injecting_ && std::strstr(e.what(), "out of memory") == nullptr &&
              std::strstr(e.what(), "asleep") == nullptr) {
            fail(std::string("torch_malloc threw ") + e.what());
          }
          break;
        }
        if (p == nullptr) {
          fail("torch_malloc returned NULL");
          break;
        }
        fill(p, size, 0x7f);
        expanse_torch_free(p, size, device, nullptr);
        int local = 0;
        expanse_torch_free(&local, 4, device, nullptr);  // reported, ignored
        break;
      }
      case 2: {
        expanse_pool_stats ps{};
        ps.struct_size = sizeof ps;
        Pool* p = pool_of(c);
        if (p == nullptr || c.pick(4) == 0) {
          expect_refused(expanse_pool_get_stats(555555555, &ps), "stats of no pool", "555555555");
        } else if (p->uses > 0 || c.pick(2) == 0) {
          const int rc = expanse_pool_get_stats(p->id, &ps);
          if (rc != EXPANSE_OK && p->uses > 0) ok_or_fault(rc, "pool_get_stats");
        }
        break;
      }
      case 3: {
        // A filter that takes nothing: the route is made and ended, no allocation moves (other
        // threads' included).
        Pool* p = pool_of(c);
        if (p == nullptr || p->uses == 0) break;
        auto none = [](struct CUstream_st*, void*) -> int { return 0; };
        if (ok_or_fault(expanse_pool_begin_filter(p->id, none, nullptr), "begin_filter")) {
          void* q = nullptr;
          const size_t size = 1 + c.pick(4096);
          if (expanse_malloc_checked(&q, size, p->device, nullptr) == EXPANSE_OK) {
            expanse_pool_id of = 99;
            if (expanse_pool_of(q, &of) == EXPANSE_OK && of == p->id && routes_ == 0) {
              fail("a filter that takes nothing routed a block to pool " + std::to_string(p->id));
            }
            if (expanse_free_checked(q, size, p->device, nullptr) != EXPANSE_OK) {
              add(q, size, p->device, of);  // freed at the end instead
            }
          }
          ok_or_fault(expanse_pool_end(p->id), "pool_end of a filter");
        }
        break;
      }
      case 4:
        if (alone_) {
          // A NULL stream names the current context's: without one the call says so.
          const int rc = expanse_capture_begin(nullptr);
          if (rc == EXPANSE_EDRIVER &&
              std::strstr(expanse_last_error(), "needs a current context") != nullptr) {
            break;
          }
          if (ok_or_fault(rc, "capture_begin")) ok_or_fault(expanse_capture_end(nullptr), "capture_end");
        }
        break;
      case 5:
        ok_or_fault(expanse_enable_peer_access(0, 1), "enable_peer_access");
        expect_refused(expanse_enable_peer_access(0, 5), "peer access to device 5", "5");
        break;
      case 6: {
        static int calls = 0;
        auto hook = [](expanse_pool_id, void* ctx) { ++*static_cast<int*>(ctx); };
        if (alone_) {
          ok_or_fault(expanse_set_wake_hook(hook, &calls), "set_wake_hook");
          ok_or_fault(expanse_set_wake_hook(nullptr, nullptr), "set_wake_hook(NULL)");
        }
        break;
      }
      case 7:
        ok_or_fault(expanse_release_host_backup(static_cast<int>(c.pick(2))), "release_host_backup");
        break;
      default:
        if (expanse_driver_description() == nullptr) fail("no driver description");
        if (expanse_device_count() != 2) fail("device_count is not 2");
        if (expanse_entry_point_name(0) == nullptr || expanse_entry_point_name(-1) != nullptr) {
          fail("entry_point_name");
        }
        if (expanse_stats_field_name(0) == nullptr || expanse_stats_field_type(0) == nullptr ||
            expanse_stats_field_name(100000) != nullptr) {
          fail("stats_field_name");
        }
        break;
    }
  }

  // Pinned host memory (expanse_host_*): allocate, free, record a stream, release, limits, stats,
  // and misuse (a device block, a foreign, interior or freed pointer, a bad node, size 0).
  void host(Choices& c) {
    switch (c.pick(6)) {
      case 0:
      case 1: {
        if (host_blocks_.size() >= 24) break;
        const size_t size = c.pick(4) == 0 ? (size_t{1} << 20) + c.pick(size_t{8} << 20)
                                           : 1 + c.pick(size_t{1} << 20);
        void* p = nullptr;
        const int rc = expanse_host_malloc(&p, size, c.pick(4) == 0 ? -1 : 0, nullptr);
        if (!ok_or_fault(rc, "host_malloc(" + std::to_string(size) + ")")) {
          if (p != nullptr) fail("a failed host_malloc gave a pointer");
          break;
        }
        const uint64_t seed = (static_cast<uint64_t>(thread_) << 48) ^ ++serial_ ^ (1ull << 47);
        fill(p, size, seed);
        host_blocks_.push_back({p, size, seed});
        break;
      }
      case 2: {
        if (host_blocks_.empty()) break;
        const size_t k = c.pick(host_blocks_.size());
        const HostBlock h = host_blocks_[k];
        if (!holds(h.ptr, h.size, h.seed)) fail("host block " + hex(h.ptr) + " lost its bytes");
        void* base = nullptr;
        size_t size = 0;
        const size_t inside = c.pick(h.size);
        if (expanse_host_block_of(static_cast<char*>(h.ptr) + inside, &base, &size) != EXPANSE_OK ||
            base != h.ptr || size != h.size) {
          fail("host_block_of " + std::to_string(inside) + " bytes into " + hex(h.ptr) +
               " found " + hex(base) + " of " + std::to_string(size) + " bytes");
        }
        if (c.pick(3) == 0) ok_or_fault(expanse_host_record_stream(h.ptr, stream_of(c)), "host_record_stream");
        // Freed as a stream's user frees, as a tensor's deleter does (after the device), or
        // through a DLPack tensor's deleter.
        const uint64_t how = c.pick(4);
        if (how == 0) {
          if (!ok_or_fault(expanse_host_free_after_device(h.ptr, c.pick(3) == 0 ? 0 : -1, 0),
                           "host_free_after_device")) {
            break;
          }
        } else if (how == 1) {
          void* managed = nullptr;
          if (!ok_or_fault(expanse_host_dlpack(h.ptr, -1, &managed), "host_dlpack")) break;
          if (managed == nullptr) fail("host_dlpack succeeded without a tensor");
          // The DLPack layout: data first, the deleter last (after manager_ctx).
          struct Managed {
            void* data;
            char tensor_rest[40];
            void* manager_ctx;
            void (*deleter)(Managed*);
          };
          auto* m = static_cast<Managed*>(managed);
          if (m->data != h.ptr) fail("host_dlpack's tensor does not start at the block");
          m->deleter(m);
        } else if (!ok_or_fault(expanse_host_free(h.ptr, stream_of(c)), "host_free")) {
          break;
        }
        host_blocks_[k] = host_blocks_.back();
        host_blocks_.pop_back();
        host_freed_.push_back(h.ptr);
        if (host_freed_.size() > 32) host_freed_.erase(host_freed_.begin());
        break;
      }
      case 3: {
        int local = 0;
        expect_refused(expanse_host_free(&local, nullptr), "host_free of a foreign pointer", hex(&local));
        if (!blocks_.empty()) {
          const Block& b = blocks_[c.pick(blocks_.size())];
          expect_refused(expanse_host_free(b.ptr, nullptr), "host_free of a device block",
                         "device block");
        }
        if (!host_blocks_.empty()) {
          const HostBlock& h = host_blocks_[c.pick(host_blocks_.size())];
          if (h.size >= 1024) {
            expect_refused(expanse_host_free(static_cast<char*>(h.ptr) + 512, nullptr),
                           "host_free of an interior pointer", "interior");
          }
        }
        if (alone_ && !host_freed_.empty()) {
          void* p = host_freed_[c.pick(host_freed_.size())];
          bool live = false;
          for (const HostBlock& h : host_blocks_) live = live || h.ptr == p;
          if (!live) expect_refused(expanse_host_free(p, nullptr), "a double host_free", "");
        }
        expect_refused(expanse_host_free_after_device(&local, 0, 0), "host_free_after_device of a "
                       "foreign pointer", hex(&local));
        if (!host_blocks_.empty()) {
          void* managed = reinterpret_cast<void*>(1);
          const HostBlock& h = host_blocks_[c.pick(host_blocks_.size())];
          expect_refused(expanse_host_free_after_device(h.ptr, 7, 0), "host_free_after_device on "
                         "device 7", "device 7");
          expect_refused(expanse_host_dlpack(h.ptr, -4, &managed), "host_dlpack on device -4",
                         "device -4");
          if (managed != nullptr) fail("a refused host_dlpack left *managed_tensor set");
        }
        void* q = nullptr;
        expect_refused(expanse_host_malloc(&q, 0, 0, nullptr), "host_malloc of 0 bytes", "0 bytes");
        expect_refused(expanse_host_malloc(&q, 4096, -3, nullptr), "host_malloc on node -3", "-3");
        break;
      }
      case 4:
        if (c.pick(3) == 0) {
          ok_or_fault(expanse_host_release_cached(), "host_release_cached");
          if (c.pick(2) == 0) ok_or_fault(expanse_host_reset_peak_stats(), "host_reset_peak_stats");
        } else if (alone_) {
          ok_or_fault(expanse_host_set_limit(c.pick(2) == 0 ? SIZE_MAX : (size_t{1} << 20) * (64 + c.pick(512))),
                      "host_set_limit");
        }
        break;
      default: {
        expanse_host_stats s{};
        s.struct_size = sizeof s;
        if (!ok_or_fault(expanse_host_get_stats(-1, &s), "host_get_stats")) break;
        if (alone_ && s.live_blocks != host_blocks_.size()) {
          fail("host stats say " + std::to_string(s.live_blocks) + " live blocks, the model " +
               std::to_string(host_blocks_.size()));
        }
        expect_refused(expanse_host_get_stats(0, nullptr), "host_get_stats(NULL)", "");
        break;
      }
    }
  }

  void misuse(Choices& c) {
    switch (c.pick(5)) {
      case 0: {
        void* p = reinterpret_cast<void*>(1);
        const int rc = expanse_malloc_checked(&p, 4096, 9, nullptr);
        expect_refused(rc, "malloc on device 9", "9");
        if (p != nullptr) fail("a refused malloc left *out set");
        break;
      }
      case 1:
        expect_refused(expanse_pool_retain(0), "retain of pool 0", "0");
        break;
      case 2: {
        const expanse_pool_id never = 1000000007ull;
        expect_refused(expanse_pool_release(never), "release of a pool never made",
                       std::to_string(never));
        break;
      }
      case 3:
        if (alone_ && !blocks_.empty()) {
          // Not with live blocks: refused, and nothing is lost.
          const int rc = expanse_shutdown();
          if (rc == EXPANSE_OK) fail("shutdown with live blocks succeeded");
        }
        break;
      default: {
        void* p = nullptr;
        const int rc = expanse_malloc_checked(&p, SIZE_MAX / 2, 0, nullptr);
        if (rc != EXPANSE_ENOMEM && rc != EXPANSE_EINVAL) {
          fail("malloc of SIZE_MAX/2 answered " + std::to_string(rc));
        }
        if (p != nullptr) fail("an impossible malloc gave a pointer");
      }
    }
  }

  int thread_;
  bool alone_;
  bool faults_;
  bool injecting_;
  size_t ops_ = 0;
  uint64_t serial_ = 0;
  std::vector<Block> blocks_;
  std::vector<void*> freed_;
  std::vector<Pool> pools_;
  std::vector<Import> imports_;
  std::vector<HostBlock> host_blocks_;
  std::vector<void*> host_freed_;
  uint64_t route_pool_ = 0;
  int routes_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace expanse::test::fuzz
