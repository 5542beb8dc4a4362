#include "support/host_alloc_failure.hpp"

#include "sim/sim.hpp"

#include <cstdlib>
#include <new>

namespace expanse::test {
namespace {

// Per thread: only the armed thread's allocations fail.
thread_local bool t_armed = false;
thread_local size_t t_calls = 0;    // operator new calls since armed
thread_local size_t t_first = 0;    // the first call that fails (1-based)
thread_local size_t t_count = 0;    // how many fail from there
thread_local size_t t_failed = 0;

bool should_fail() noexcept {
  // The driver's own allocations are not the application's (sim::inside_call).
  if (!t_armed || expanse::sim::inside_call()) return false;
  const size_t call = ++t_calls;
  if (call < t_first || call - t_first >= t_count) return false;
  ++t_failed;
  return true;
}

void* allocate(size_t n) {
  if (should_fail()) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

}  // namespace

HostAllocFailure::HostAllocFailure(size_t n, size_t count) {
  t_calls = 0;
  t_failed = 0;
  t_first = n == 0 ? 1 : n;
  t_count = count;
  t_armed = true;
}

size_t HostAllocFailure::stop() {
  t_armed = false;
  return t_calls;
}

size_t HostAllocFailure::failed() const { return t_failed; }

}  // namespace expanse::test

void* operator new(size_t n) { return expanse::test::allocate(n); }
void* operator new[](size_t n) { return expanse::test::allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return expanse::test::allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return expanse::test::allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
