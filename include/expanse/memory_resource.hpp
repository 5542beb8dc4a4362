// expanse — a CCCL memory resource (header-only): expanse::memory_resource satisfies
// cuda::mr's resource concepts with the cuda::mr::device_accessible property, so it plugs into
// cuda::mr::resource_ref / async_resource_ref (and, from CCCL 3.2, any_resource) and into the
// libraries built on them.
//
// CCCL changed these concepts between releases; the header picks the form by CCCL_VERSION:
//
//   CCCL 3.0 (CUDA 13.0) and 2.x     resource:             allocate(bytes, alignment)
//                                                          deallocate(ptr, bytes, alignment)
//                                    async_resource:       allocate_async(bytes, alignment, stream)
//                                                          deallocate_async(ptr, bytes, alignment, stream)
//                                    needs LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE, which
//                                    this header defines (include it before <cuda/memory_resource>,
//                                    or define the macro yourself; 3.1 needs it for resource_ref).
//   CCCL 3.1+ (CUDA 13.1+)           synchronous_resource: allocate_sync(bytes, alignment)
//                                                          deallocate_sync(ptr, bytes, alignment)
//                                    resource:             allocate(stream, bytes, alignment)
//                                                          deallocate(stream, ptr, bytes, alignment)
//
// The CCCL 3.0 form is what expanse's CI compiles and runs (CUDA 13.0). The 3.1+ form was
// checked by hand with g++ against the libcu++ headers of CCCL 3.1.0, 3.2.0 and 3.6 (concepts,
// resource_ref, any_resource); CI has no such toolkit.
//
// Semantics. The stream-ordered members allocate and free in the order of `stream`, as
// expanse::allocate/deallocate do: the memory may be used on `stream` at once, on other streams
// after synchronising with it. The synchronous members are ordered on the legacy default stream
// (stream 0), which is ordered with every blocking stream, as cudaMalloc/cudaFree are in
// practice; with non-blocking streams, synchronise before a synchronous free. Alignment: any
// power of two up to memory_resource::max_alignment (512 B, expanse's carving granularity);
// larger or malformed alignments throw expanse::usage_error. Errors: allocation throws
// expanse::out_of_memory (a std::bad_alloc) or another expanse exception; deallocation is
// noexcept (a pointer expanse did not hand out ends in std::terminate, like a double free).
//
// Needs the CUDA toolkit's include directories (<CUDA>/include for cuda_runtime_api.h, which
// cuda::stream_ref uses, and <CUDA>/include/cccl on CUDA 13); nothing links libcudart.
#pragma once

#include "expanse/expanse.hpp"

#include <cuda/std/version>  // CCCL_VERSION

#include <cstddef>
#include <string>

#if !defined(CCCL_VERSION)
#error "expanse/memory_resource.hpp: CCCL_VERSION is not defined; this needs CCCL (libcu++) 2.2 or newer"
#endif

// CCCL 3.0 compiles cuda::mr only with LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; 3.1 still
// needs it for resource_ref; 3.2 dropped the macro.
#if CCCL_VERSION < 3002000 && !defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#if CCCL_VERSION < 3001000 && defined(_CUDA_MEMORY_RESOURCE)
#error "expanse/memory_resource.hpp: <cuda/memory_resource> was included before without LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; include expanse/memory_resource.hpp first or define the macro for the whole target"
#endif
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#if CCCL_VERSION < 3001000
#define EXPANSE_CCCL_MR_3_0 1
#else
#define EXPANSE_CCCL_MR_3_0 0
#endif

#include <cuda/memory_resource>
#if EXPANSE_CCCL_MR_3_0
#include <cuda/stream_ref>
#endif

namespace expanse {

/// A cuda::mr memory resource that allocates from expanse on one device. A value type: cheap to
/// copy (an int), default-constructible, equal to another when it allocates on the same device
/// (either can free what the other allocated). Constructing one does not initialise expanse;
/// the first allocation does (from EXPANSE_CONF, or an earlier expanse::init()).
class memory_resource {
 public:
  /// The largest alignment the resource accepts: expanse carves blocks at 512 B.
  static constexpr std::size_t max_alignment = 512;
  /// The alignment used when none is given (cudaMalloc's guarantee).
  static constexpr std::size_t default_alignment = 256;

  memory_resource() noexcept = default;
  explicit memory_resource(int device) noexcept : device_(device) {}

  int device() const noexcept { return device_; }

#if EXPANSE_CCCL_MR_3_0
  // ---- CCCL 3.0: cuda::mr::resource and cuda::mr::async_resource ----

  /// Synchronous: usable on every blocking stream at once (ordered on the legacy default stream).
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    return do_allocate(bytes, alignment, nullptr);
  }
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    do_deallocate(ptr, bytes, alignment, nullptr);
  }

  /// Stream-ordered on `stream`.
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return do_allocate(bytes, alignment, stream.get());
  }
  void* allocate_async(std::size_t bytes, ::cuda::stream_ref stream) {
    return do_allocate(bytes, default_alignment, stream.get());
  }
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment,
                        ::cuda::stream_ref stream) noexcept {
    do_deallocate(ptr, bytes, alignment, stream.get());
  }
  void deallocate_async(void* ptr, std::size_t bytes, ::cuda::stream_ref stream) noexcept {
    do_deallocate(ptr, bytes, default_alignment, stream.get());
  }
#else
  // ---- CCCL 3.1+: cuda::mr::synchronous_resource and cuda::mr::resource (not compiled in CI) ----

  /// Synchronous: usable on every blocking stream at once (ordered on the legacy default stream).
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return do_allocate(bytes, alignment, nullptr);
  }
  void deallocate_sync(void* ptr, std::size_t bytes,
                       std::size_t alignment = default_alignment) noexcept {
    do_deallocate(ptr, bytes, alignment, nullptr);
  }

  /// Stream-ordered on `stream`.
  void* allocate(::cuda::stream_ref stream, std::size_t bytes,
                 std::size_t alignment = default_alignment) {
    return do_allocate(bytes, alignment, stream.get());
  }
  void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes,
                  std::size_t alignment = default_alignment) noexcept {
    do_deallocate(ptr, bytes, alignment, stream.get());
  }
#endif

  friend bool operator==(const memory_resource& a, const memory_resource& b) noexcept {
    return a.device_ == b.device_;
  }
  friend bool operator!=(const memory_resource& a, const memory_resource& b) noexcept {
    return !(a == b);
  }

  /// Memory from expanse is device memory.
  friend void get_property(const memory_resource&, ::cuda::mr::device_accessible) noexcept {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream) const {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > max_alignment) {
      throw usage_error("expanse::memory_resource: alignment " + std::to_string(alignment) +
                        " is not a power of two up to " + std::to_string(max_alignment));
    }
    return expanse::allocate(bytes, device_, stream);
  }
  void do_deallocate(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/,
                     stream_t stream) const noexcept {
    expanse::deallocate(ptr, device_, stream);
  }

  int device_ = 0;
};

}  // namespace expanse
