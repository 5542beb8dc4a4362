// expanse — Thrust integration (header-only).
//
//   expanse::thrust_allocator<T>          an allocator for thrust::device_vector<T, ...>
//   expanse::device_vector<T>             thrust::device_vector<T, expanse::thrust_allocator<T>>
//   expanse::thrust_temporary_allocator   an allocator for Thrust's temporary storage
//   expanse::thrust_exec_policy(stream)   thrust::cuda::par(temporary allocator).on(stream)
//
// Include paths: Thrust ships with the CUDA toolkit under <CUDA>/include/cccl (CUDA 13) or
// <CUDA>/include (CUDA 12). nvcc finds it by itself; a host compiler needs -I<CUDA>/include/cccl.
// With nvcc the CUDA backend is used. With a host compiler Thrust's CPP (or OMP/TBB) device
// system runs the algorithms on the CPU; that only makes sense where device memory is host
// accessible, i.e. on the sim (EXPANSE_CONF=driver:sim), which is how expanse's tests use it.
//
// Stream semantics are expanse's (see expanse.hpp): memory is allocated and freed in the order of
// the allocator's stream. Run the algorithms on that stream (thrust_exec_policy(stream)); memory
// from an allocator on stream A may be freed by one on stream B, expanse then waits for A's work
// before handing the memory to anyone else.
#pragma once

#include "expanse/expanse.hpp"

#include <thrust/device_ptr.h>
#include <thrust/device_reference.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/version.h>

#include <cstddef>
#include <new>
#include <type_traits>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <thrust/system/cuda/execution_policy.h>
#endif

#if defined(__CUDACC__)
#define EXPANSE_HOST_DEVICE __host__ __device__
#else
#define EXPANSE_HOST_DEVICE
#endif

namespace expanse {

/// An allocator that takes Thrust's memory from expanse: `allocate(n)` is
/// `expanse::allocate(n * sizeof(T), device, stream)`, `deallocate` is
/// `expanse::deallocate(p, device, stream)`.
///
/// `pointer` is `thrust::device_ptr<T>`, so a `thrust::device_vector<T, thrust_allocator<T>>`
/// has device-system iterators and algorithms on it run on the device. (An allocator whose
/// pointer is a raw `T*` makes Thrust run the algorithms on the host, silently.)
///
/// Two allocators compare equal when they allocate on the same device: either can free what
/// the other allocated (the stream only orders the operations). Copyable, cheap (an int and a
/// pointer). `allocate` throws expanse::out_of_memory (a std::bad_alloc) or another expanse
/// exception; `deallocate` never throws (a bad pointer is reported by std::terminate, like a
/// double free).
template <typename T>
class thrust_allocator {
 public:
  using value_type = T;
  using pointer = thrust::device_ptr<T>;
  using const_pointer = thrust::device_ptr<const T>;
  using reference = thrust::device_reference<T>;
  using const_reference = thrust::device_reference<const T>;
  using size_type = std::size_t;
  using difference_type = typename pointer::difference_type;

  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  template <typename U>
  struct rebind {
    using other = thrust_allocator<U>;
  };

  /// Allocates on device 0, ordered on the legacy default stream.
  EXPANSE_HOST_DEVICE thrust_allocator() noexcept : device_(0), stream_(nullptr) {}
  /// Allocates on `device`, ordered on `stream` (nullptr: the legacy default stream).
  EXPANSE_HOST_DEVICE explicit thrust_allocator(int device, stream_t stream = nullptr) noexcept
      : device_(device), stream_(stream) {}

  template <typename U>
  EXPANSE_HOST_DEVICE thrust_allocator(const thrust_allocator<U>& other) noexcept  // NOLINT
      : device_(other.device()), stream_(other.stream()) {}

  pointer allocate(size_type n) {
    if (n > max_size()) throw std::bad_array_new_length();
    return pointer(static_cast<T*>(expanse::allocate(n * sizeof(T), device_, stream_)));
  }

  void deallocate(pointer p, size_type /*n*/) noexcept {
    expanse::deallocate(static_cast<void*>(p.get()), device_, stream_);
  }

  EXPANSE_HOST_DEVICE size_type max_size() const noexcept {
    return static_cast<size_type>(-1) / sizeof(T);
  }

  EXPANSE_HOST_DEVICE int device() const noexcept { return device_; }
  EXPANSE_HOST_DEVICE stream_t stream() const noexcept { return stream_; }

  template <typename U>
  EXPANSE_HOST_DEVICE bool operator==(const thrust_allocator<U>& other) const noexcept {
    return device_ == other.device();
  }
  template <typename U>
  EXPANSE_HOST_DEVICE bool operator!=(const thrust_allocator<U>& other) const noexcept {
    return !(*this == other);
  }

 private:
  int device_;
  stream_t stream_;
};

/// `thrust::device_vector` whose memory comes from expanse.
template <typename T>
using device_vector = thrust::device_vector<T, thrust_allocator<T>>;

/// The allocator for Thrust's temporary storage (sort, reduce, scan ... ask for scratch memory):
/// bytes (`value_type` char) from expanse on a device and stream. Pass it to an execution policy:
/// `thrust::cuda::par(alloc).on(stream)`, or, for the other device systems,
/// `thrust::device(alloc)`; `thrust_exec_policy()` builds the first.
using thrust_temporary_allocator = thrust_allocator<char>;

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA

/// `thrust::cuda::par(thrust_temporary_allocator(device, stream)).on(stream)`: algorithms run on
/// `stream` and take their temporary storage from expanse on `device`, ordered on `stream`. The
/// policy holds its allocator by value, so it may outlive this call.
inline auto thrust_exec_policy(stream_t stream = nullptr, int device = 0) {
  return thrust::cuda::par(thrust_temporary_allocator(device, stream)).on(stream);
}

/// Like thrust_exec_policy, with `thrust::cuda::par_nosync`: algorithms may return before their
/// kernels finish; synchronise `stream` before reading results on the host.
inline auto thrust_exec_policy_nosync(stream_t stream = nullptr, int device = 0) {
  return thrust::cuda::par_nosync(thrust_temporary_allocator(device, stream)).on(stream);
}

#else

/// Other device systems (CPP, OMP, TBB: host-compiled tests on the sim) have no streams:
/// `thrust::device(thrust_temporary_allocator(device, stream))`, temporary storage from expanse,
/// algorithms on the host threads.
inline auto thrust_exec_policy(stream_t stream = nullptr, int device = 0) {
  return thrust::device(thrust_temporary_allocator(device, stream));
}

inline auto thrust_exec_policy_nosync(stream_t stream = nullptr, int device = 0) {
  return thrust_exec_policy(stream, device);
}

#endif

}  // namespace expanse

#undef EXPANSE_HOST_DEVICE
