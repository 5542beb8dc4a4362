// Invariant 3's reference model (docs/design.md): memory freed while work on it may be pending.
//
// Before each free the test records its own event on every stream that may still use the block
// (the freeing stream, the allocating stream, record_stream users) and hands the block here
// (freed). An allocation on stream T may overlap freed memory only once every such event is
// complete, but for T's own events, which T's new work is ordered after anyway
// (check_allocation). A block whose events all completed is proven done and forgotten
// (forget_done).
//
//   #include "support/freed_memory_oracle.hpp"   (${PROJECT_SOURCE_DIR}/test on the include path)
//   FreedMemoryOracle<StreamUse<CUstream>> oracle(driver_table);
//
// Use: what the test keeps per event; it has members `stream` (how the test names a stream: a
// handle, an index, a logical id; compared with ==) and `event`. Not thread-safe: a test with
// threads locks around it.
#pragma once

#include "driver/driver.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace expanse::test {

template <class Stream>
struct StreamUse {
  Stream stream;
  CUevent event;
};

template <class Use>
class FreedMemoryOracle {
 public:
  using Stream = decltype(Use::stream);
  // When a use on the allocating stream T counts as ordered before T's new work.
  enum class Ordered {
    own_stream,            // any use on T
    freed_on_own_stream,   // a use on T of a block T freed (stricter: a free on another
                           // stream must be proven done even for T's own work)
  };
  struct Freed {
    uintptr_t addr = 0;
    size_t size = 0;
    Stream freed_on{};
    std::vector<Use> uses;  // events recorded before the free
    // Optional: the handle mapped under each page at the free (for the test's own checks).
    std::map<uintptr_t, CUmemGenericAllocationHandle> pages;
  };

  explicit FreedMemoryOracle(const driver::DriverTable& t, Ordered rule = Ordered::own_stream)
      : t_(t), rule_(rule) {}

  bool done(const Use& u) const { return t_.event_query(u.event) == CUDA_SUCCESS; }
  bool all_done(const Freed& f) const {
    for (const Use& u : f.uses) {
      if (!done(u)) return false;
    }
    return true;
  }

  // Record-before-free: f's events were recorded before its free.
  void freed(Freed f) { freed_.push_back(std::move(f)); }

  // Check-allocation: [a, a + n) was just allocated on stream `on`. For every freed block it
  // overlaps, violation(freed, use) for each use still pending and not ordered before the
  // allocation. Returns how many freed blocks it overlaps.
  template <class F>
  size_t check_allocation(uintptr_t a, size_t n, const Stream& on, F&& violation) const {
    size_t met = 0;
    for (const Freed& f : freed_) {
      if (!(a < f.addr + f.size && f.addr < a + n)) continue;
      ++met;
      for (const Use& u : f.uses) {
        const bool ordered =
            u.stream == on && (rule_ == Ordered::own_stream || f.freed_on == on);
        if (!ordered && !done(u)) violation(f, u);
      }
    }
    return met;
  }

  // Uses still pending, of freed blocks overlapping [a, a + n) (an unmap there is a violation).
  size_t pending_uses_in(uintptr_t a, size_t n) const {
    size_t pending = 0;
    for (const Freed& f : freed_) {
      if (!(a < f.addr + f.size && f.addr < a + n)) continue;
      for (const Use& u : f.uses) pending += done(u) ? 0 : 1;
    }
    return pending;
  }

  // Uses still pending on streams other than `on`, of every freed block.
  size_t pending_uses_of_others(const Stream& on) const {
    size_t pending = 0;
    for (const Freed& f : freed_) {
      for (const Use& u : f.uses) pending += !(u.stream == on) && !done(u) ? 1 : 0;
    }
    return pending;
  }

  // Forget-what-is-proven: drops the freed blocks whose every use completed; release(use) gets
  // each of their uses (to destroy or reuse the event).
  template <class F>
  void forget_done(F&& release) {
    for (size_t i = 0; i < freed_.size();) {
      if (!all_done(freed_[i])) {
        ++i;
        continue;
      }
      for (const Use& u : freed_[i].uses) release(u);
      freed_[i] = std::move(freed_.back());
      freed_.pop_back();
    }
  }

  // f(freed) for every freed block with a use still pending. Returns how many.
  template <class F>
  size_t for_each_pending(F&& f) const {
    size_t n = 0;
    for (const Freed& b : freed_) {
      if (all_done(b)) continue;
      ++n;
      f(b);
    }
    return n;
  }

  // Forgets everything (the test's end); release(use) gets every use.
  template <class F>
  void clear(F&& release) {
    for (const Freed& f : freed_) {
      for (const Use& u : f.uses) release(u);
    }
    freed_.clear();
  }

  size_t size() const noexcept { return freed_.size(); }

 private:
  const driver::DriverTable& t_;
  Ordered rule_;
  std::vector<Freed> freed_;
};

}  // namespace expanse::test
