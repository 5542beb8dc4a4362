// The exceptions the C++ API throws. The C ABI never throws: it returns NULL / an error code and
// keeps the message for expanse_last_error().
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

#if defined(_WIN32)
#define EXPANSE_API
#else
#define EXPANSE_API __attribute__((visibility("default")))
#endif

namespace expanse {

// The device has no physical memory left for the request (after pooling, reclaiming and
// creating). Derives from std::bad_alloc so generic code handles it as an allocation failure.
class EXPANSE_API out_of_memory : public std::bad_alloc {
 public:
  out_of_memory(std::string message, size_t requested, int device)
      : message_(std::move(message)), requested_(requested), device_(device) {}
  const char* what() const noexcept override { return message_.c_str(); }
  size_t requested() const noexcept { return requested_; }
  int device() const noexcept { return device_; }

 private:
  std::string message_;
  size_t requested_;
  int device_;
};

// Bad input: a pointer expanse did not hand out (or already freed), an interior pointer, a wrong
// device, a size that overflows, a bad configuration key. Nothing was changed.
class EXPANSE_API usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The driver failed in a way that is not "out of memory" (or could not be loaded).
class EXPANSE_API driver_failure : public std::runtime_error {
 public:
  driver_failure(const std::string& what, int cu_result)
      : std::runtime_error(what), cu_result_(cu_result) {}
  int cu_result() const noexcept { return cu_result_; }

 private:
  int cu_result_;
};

}  // namespace expanse
