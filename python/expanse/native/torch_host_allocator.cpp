// expanse as PyTorch's CUDA host allocator: the at::HostAllocator that at::getHostAllocator(kCUDA)
// returns (at::setHostAllocator, PyTorch 2.8 and newer), so that torch.empty(pin_memory=True),
// Tensor.pin_memory(), DataLoader(pin_memory=True) and the pinned staging of non_blocking copies
// get expanse's pinned host memory: exact to the host granularity where PyTorch's caching host
// allocator rounds to a power of two, and fungible across sizes.
//
// Reuse follows PyTorch's contract, made safe where PyTorch's is not: a block a non_blocking copy
// used is recorded by PyTorch (record_event) and reused once those streams are done; a block
// with no recorded stream, which PyTorch's own allocator hands out again at once, is reused
// after every stream of its device has passed its free (expanse_host_free_after_device).
// Installed beside, or without, expanse's CUDA allocator (torch_allocator.cpp); built into the
// same extension by expanse.torch. Version differences: torch_version.hpp.
#define EXPANSE_NULL_STREAM_IS_LEGACY 1  // PyTorch's stream 0 is the legacy default stream
#include "torch_version.hpp"

#include <expanse/expanse.h>

#include <string>

#if EXPANSE_TORCH_HAS_HOST_ALLOCATOR
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>

namespace expanse::torch_native {
namespace {

// PyTorch's own CUDA host allocator registers with priority 0; a later registration of a
// priority at least as high replaces it.
constexpr uint8_t kPriority = 100;

void free_host_block(void* ctx) {
  // Any thread, at any time (interpreter exit included): a refusal is in expanse_last_error and
  // the block stays live in its pool, nothing else touched.
  if (ctx != nullptr) expanse_host_free_after_device(ctx, -1);
}

class ExpanseHostAllocator final : public at::HostAllocator {
 public:
  explicit ExpanseHostAllocator(at::HostAllocator* previous) : previous_(previous) {}

  at::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &free_host_block, at::DeviceType::CPU};
    // The current stream picks the NUMA node nearest its device, and the block's device.
    CUstream_st* stream = nullptr;
    try {
      stream = reinterpret_cast<CUstream_st*>(c10::cuda::getCurrentCUDAStream().stream());
    } catch (const c10::Error&) {
      stream = nullptr;  // no CUDA device yet: the node of device 0
    }
    void* p = nullptr;
    const int rc = expanse_host_malloc(&p, n, -1, stream);
    if (rc == EXPANSE_ENOMEM) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "expanse: pinned host memory: ",
                       expanse_last_error());
    }
    TORCH_CHECK(rc == EXPANSE_OK, "expanse: pinned host memory: ", expanse_last_error());
    return {p, p, &free_host_block, at::DeviceType::CPU};
  }

  at::DeleterFnPtr raw_deleter() const override { return &free_host_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // ptr may be inside the block (a slice); ctx is the block's start, as allocate() set it.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    if (ctx != nullptr && stream.device_type() == at::DeviceType::CUDA) {
      const c10::cuda::CUDAStream cs(c10::cuda::CUDAStream::UNCHECKED, stream);
      if (expanse_host_record_stream(ctx, reinterpret_cast<CUstream_st*>(cs.stream())) ==
          EXPANSE_OK) {
        return true;
      }
    }
    // Not a block of expanse's: one PyTorch's own allocator pinned before this one was
    // installed, still ordered by it.
    return previous_ != nullptr && previous_->record_event(ptr, ctx, stream);
  }

  void empty_cache() override {
    expanse_host_release_cached();
    // What the allocator before expanse still caches is never handed out again: give it back.
    if (previous_ != nullptr) previous_->empty_cache();
  }

  at::HostStats get_stats() override {
    expanse_host_stats s{};
    s.struct_size = sizeof s;
    at::HostStats out;
    if (expanse_host_get_stats(-1, &s) != EXPANSE_OK) return out;
    const uint64_t allocs = s.num_allocs - allocs_base_.load();
    const uint64_t frees = s.num_frees - frees_base_.load();
    out.active_requests.current = static_cast<int64_t>(s.live_blocks);
    out.active_requests.allocated = static_cast<int64_t>(allocs);
    out.active_requests.freed = static_cast<int64_t>(frees);
    out.active_requests.peak = out.active_requests.current;
    out.active_bytes.current = static_cast<int64_t>(s.allocated_bytes);
    out.active_bytes.peak = out.active_bytes.current;
    out.allocations.current = static_cast<int64_t>(s.live_blocks + s.pending_blocks);
    out.allocations.peak = out.allocations.current;
    out.allocated_bytes.current = static_cast<int64_t>(s.pinned_bytes);
    out.allocated_bytes.peak = static_cast<int64_t>(s.peak_pinned_bytes);
    out.num_host_alloc = static_cast<int64_t>(s.num_created_pages);
    out.num_host_free = static_cast<int64_t>(s.num_released_pages);
    return out;
  }

  void reset_accumulated_stats() override {
    expanse_host_stats s{};
    s.struct_size = sizeof s;
    if (expanse_host_get_stats(-1, &s) != EXPANSE_OK) return;
    allocs_base_ = s.num_allocs;
    frees_base_ = s.num_frees;
  }

  void reset_peak_stats() override { expanse_host_reset_peak_stats(); }

 private:
  at::HostAllocator* previous_;
  std::atomic<uint64_t> allocs_base_{0};
  std::atomic<uint64_t> frees_base_{0};
};

ExpanseHostAllocator* g_host = nullptr;
thread_local std::string g_host_error;

}  // namespace
}  // namespace expanse::torch_native

extern "C" {

// Makes expanse PyTorch's CUDA host allocator. 0 on success; 2 where this PyTorch lets no
// extension replace it; 1 on another failure. The reason is in expanse_torch_native_host_error().
__attribute__((visibility("default"))) int expanse_torch_native_install_host(void) {
  using namespace expanse::torch_native;
  try {
    if (g_host != nullptr && at::getHostAllocator(at::kCUDA) == g_host) return 0;
    at::HostAllocator* previous = nullptr;
    try {
      previous = at::getHostAllocator(at::kCUDA);
    } catch (const c10::Error&) {
      previous = nullptr;  // none registered (a PyTorch built without CUDA's)
    }
    // Never destroyed: blocks freed during interpreter exit still reach it.
    if (g_host == nullptr) g_host = new ExpanseHostAllocator(previous);
    at::setHostAllocator(at::kCUDA, g_host, kPriority);
    if (at::getHostAllocator(at::kCUDA) != g_host) {
      g_host_error = "PyTorch kept another CUDA host allocator, registered with a higher "
                     "priority than expanse's";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    g_host_error = e.what();
  } catch (...) {
    g_host_error = "unknown error";
  }
  return 1;
}

__attribute__((visibility("default"))) int expanse_torch_native_host_installed(void) {
  using namespace expanse::torch_native;
  try {
    return g_host != nullptr && at::getHostAllocator(at::kCUDA) == g_host ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

__attribute__((visibility("default"))) const char* expanse_torch_native_host_error(void) {
  return expanse::torch_native::g_host_error.c_str();
}

}  // extern "C"

#else  // a PyTorch without the host allocator registry

namespace {
thread_local std::string g_host_error;
}  // namespace

extern "C" {

__attribute__((visibility("default"))) int expanse_torch_native_install_host(void) {
  g_host_error = "this PyTorch (older than 2.8) lets no extension replace its CUDA host "
                 "allocator (at::setHostAllocator arrived in 2.8): use expanse.host.empty() for "
                 "exact pinned tensors";
  return 2;
}

__attribute__((visibility("default"))) int expanse_torch_native_host_installed(void) { return 0; }

__attribute__((visibility("default"))) const char* expanse_torch_native_host_error(void) {
  return g_host_error.c_str();
}

}  // extern "C"

#endif  // EXPANSE_TORCH_HAS_HOST_ALLOCATOR
