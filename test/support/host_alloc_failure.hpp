// Host memory running out, on demand: the calling thread's operator new fails (std::bad_alloc)
// from its n-th call on, so that tests can see what a failure at each allocation point leaves.
// Calls made inside a sim entry point neither count nor fail: the driver's host memory is its own.
//
// The replacement operator new / delete live in host_alloc_failure.cpp: link it into the test
// executable (one per executable; it replaces them for the whole program, and costs one
// thread-local check per allocation).
//
//   expanse::test::HostAllocFailure fail(3);  // this thread's 3rd allocation from now fails
//   ...                                       // and so does every later one (persistent)
//   fail.stop();                              // or at the end of the scope
#pragma once

#include <cstddef>
#include <cstdint>

namespace expanse::test {

class HostAllocFailure {
 public:
  // From the calling thread's n-th operator new on (n >= 1), `count` calls fail (SIZE_MAX:
  // every one until stopped).
  explicit HostAllocFailure(size_t n, size_t count = SIZE_MAX);
  ~HostAllocFailure() {
    if (!kept_) stop();
  }
  HostAllocFailure(const HostAllocFailure&) = delete;
  HostAllocFailure& operator=(const HostAllocFailure&) = delete;

  // Allocations succeed again. Returns how many operator new calls this thread made while armed
  // (failed ones included).
  size_t stop();
  // How many calls failed so far.
  size_t failed() const;
  // Stays armed after this object is gone, until the thread ends (what the thread's exit does
  // fails too) or another one arms it.
  void keep_armed() noexcept { kept_ = true; }

 private:
  bool kept_ = false;
};

}  // namespace expanse::test
