// expanse — C++ API. Errors are exceptions: expanse::out_of_memory (a std::bad_alloc),
// expanse::usage_error (bad pointer, size, device or configuration), expanse::driver_failure.
#pragma once

#include "expanse/errors.hpp"
#include "expanse/expanse.h"

#include <cstddef>
#include <map>
#include <string>

namespace expanse {

using stream_t = CUstream_st*;  // cudaStream_t / CUstream

struct EXPANSE_API Stats : expanse_stats {
  // Driver calls by entry point name, zero counts left out.
  std::map<std::string, uint64_t> driver_calls_by_name() const;
};

// Configures expanse from an EXPANSE_CONF-style string (see expanse_init).
EXPANSE_API void init(const std::string& conf);
EXPANSE_API void shutdown();
EXPANSE_API std::string driver_description();
EXPANSE_API int device_count();

// Stream-ordered allocation on a device. allocate(0) returns nullptr.
EXPANSE_API void* allocate(size_t bytes, int device = 0, stream_t stream = nullptr);
EXPANSE_API void deallocate(void* ptr, int device = 0, stream_t stream = nullptr);
EXPANSE_API void record_stream(void* ptr, stream_t stream);

// A handle to one device's allocator (created on first use; cheap to copy).
class EXPANSE_API device_allocator {
 public:
  explicit device_allocator(int device = 0);
  int device() const noexcept { return device_; }

  void* allocate(size_t bytes, stream_t stream = nullptr) const;
  void deallocate(void* ptr, stream_t stream = nullptr) const;
  void record_stream(void* ptr, stream_t stream) const;
  void release_cached() const;
  void set_limit(size_t bytes) const;
  Stats stats() const;
  void reset_peak_stats() const;

 private:
  int device_;
};

}  // namespace expanse
