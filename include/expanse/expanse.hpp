// expanse — C++ API. Errors are exceptions: expanse::out_of_memory (a std::bad_alloc),
// expanse::usage_error (bad pointer, size, device or configuration), expanse::driver_failure.
#pragma once

#include "expanse/errors.hpp"
#include "expanse/expanse.h"

#include <cstddef>
#include <cstdint>
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

// Pinned host memory (expanse_host_*, see expanse.h): exact, fungible, stream-ordered.
// numa_node -1: the node nearest the stream's device. host_free: reused once stream's work (and
// that of the streams host_record_stream named) is done.
using host_stats_t = expanse_host_stats;
EXPANSE_API void* host_allocate(size_t bytes, int numa_node = -1, stream_t stream = nullptr);
EXPANSE_API void host_deallocate(void* ptr, stream_t stream = nullptr);
// For a user that cannot name the stream that last used the block (a tensor's deleter): see
// expanse_host_free_after_device.
EXPANSE_API void host_deallocate_after_device(void* ptr, int device = -1);
EXPANSE_API void host_record_stream(void* ptr, stream_t stream);
EXPANSE_API void host_release_cached();
EXPANSE_API host_stats_t host_stats(int numa_node = -1);

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
  // expanse_reserve / expanse_unreserve (expanse.h); reserve returns the bytes reserved and
  // throws expanse::out_of_memory or expanse::usage_error.
  size_t reserve(size_t bytes) const;
  void unreserve() const;
  Stats stats() const;
  void reset_peak_stats() const;

 private:
  int device_;
};

// A pool (expanse_pool_*, see expanse.h): a private reuse domain on one device. The object holds
// one use of the pool (created with use count 1, released when the object is destroyed or
// release() is called); movable, not copyable.
using pool_stats = expanse_pool_stats;

class EXPANSE_API pool {
 public:
  explicit pool(int device = 0);
  ~pool();  // releases its use (never throws)
  pool(pool&& other) noexcept;
  pool& operator=(pool&& other) noexcept;
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;

  expanse_pool_id id() const noexcept { return id_; }  // 0 once released or moved from
  int device() const noexcept { return device_; }
  pool_stats stats() const;
  // size bytes in this pool, ordered on stream (a stream of the pool's device); free it with
  // expanse::deallocate / expanse_free. allocate(0) returns nullptr.
  void* allocate(size_t bytes, stream_t stream = nullptr) const;
  // Gives up this object's use now (the pool's memory is returned once no use is left).
  void release();
  // Sleep and wake (expanse_pool_sleep / expanse_pool_wake): the pool's pages go back to the
  // driver, its addresses stay. offload: its live blocks' bytes are kept in pinned host memory
  // and come back at wake; otherwise dropped. sleep() returns false, with nothing changed, while
  // a capture is announced on the device or routed into the pool. sleep_zeroed() drops the
  // content and the blocks come back zeroed at wake.
  bool sleep(bool offload = true, stream_t stream = nullptr) const;
  bool sleep_zeroed(stream_t stream = nullptr) const;
  void wake(stream_t stream = nullptr) const;
  bool asleep() const;

 private:
  expanse_pool_id id_ = 0;
  int device_ = 0;
};

// Routes the calling thread's allocations on the pool's device to the pool for the scope
// (expanse_pool_begin_thread / the end of that route).
class EXPANSE_API pool_scope {
 public:
  explicit pool_scope(const pool& p);
  ~pool_scope();
  pool_scope(const pool_scope&) = delete;
  pool_scope& operator=(const pool_scope&) = delete;

 private:
  uint64_t route_;
};

// Routes the allocations of the capture `stream` is in (or begins in the scope) to the pool, and
// announces the capture, for the scope (expanse_pool_begin_capture). Open it before
// cudaStreamBeginCapture and close it after cudaStreamEndCapture.
class EXPANSE_API capture_scope {
 public:
  capture_scope(const pool& p, stream_t stream);
  ~capture_scope();
  capture_scope(const capture_scope&) = delete;
  capture_scope& operator=(const capture_scope&) = delete;

 private:
  uint64_t route_;
};

}  // namespace expanse
