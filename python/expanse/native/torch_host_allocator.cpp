// expanse as PyTorch's CUDA host allocator: the at::HostAllocator that at::getHostAllocator(kCUDA)
// returns (at::setHostAllocator, PyTorch 2.8 and newer), so that torch.empty(pin_memory=True),
// Tensor.pin_memory(), DataLoader(pin_memory=True) and the pinned staging of non_blocking copies
// get expanse's pinned host memory: exact to the host granularity where PyTorch's caching host
// allocator rounds to a power of two, and fungible across sizes.
//
// Reuse follows PyTorch's contract, made safe where PyTorch's is not: a block a non_blocking copy
// used is recorded by PyTorch (record_event) and reused once those streams are done; a block
// with no recorded stream, which PyTorch's own allocator hands out again at once, is reused
// after every stream of its device has passed its free (expanse_host_free_after_device); a block
// allocated while a CUDA graph captured is the graph's until its pool is released.
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
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace expanse::torch_native {
namespace {

// PyTorch's own CUDA host allocator registers with priority 0; a later registration of a
// priority at least as high replaces it.
constexpr uint8_t kPriority = 100;

void free_host_block(void* ctx);

class ExpanseHostAllocator final : public at::HostAllocator {
 public:
  explicit ExpanseHostAllocator(at::HostAllocator* previous) : previous_(previous) {}

  at::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &free_host_block, at::DeviceType::CPU};
    // The current stream picks the NUMA node nearest its device, and the block's device.
    CUstream_st* stream = nullptr;
    c10::Stream current(c10::Stream::DEFAULT, c10::Device(at::kCUDA, 0));
    try {
      const c10::cuda::CUDAStream cs = c10::cuda::getCurrentCUDAStream();
      stream = reinterpret_cast<CUstream_st*>(cs.stream());
      current = cs.unwrap();
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
    try {
      tag_if_captured(p, current);
    } catch (...) {
      expanse_host_free(p, nullptr);  // PyTorch's filter asks the driver, which may throw
      throw;
    }
    return {p, p, &free_host_block, at::DeviceType::CPU};
  }

  // The deleter: any thread, at any time (interpreter exit included). A block a CUDA graph
  // captured is held for its pool until release_pool (the graph's copies read it at every
  // replay); any other is freed after its device unless PyTorch recorded its streams. A refusal
  // is in expanse_last_error and the block stays live in its pool, nothing else touched.
  void free_block(void* p) {
    if (tagged_.load(std::memory_order_acquire) != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = captured_.find(p);
      if (it != captured_.end()) {
        held_[it->second].push_back(p);
        captured_.erase(it);
        tagged_.fetch_sub(1, std::memory_order_release);
        return;
      }
    }
    expanse_host_free_after_device(p, -1, 0);
  }

  at::DeleterFnPtr raw_deleter() const override { return &free_host_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // ptr may be inside the block (a slice); ctx is the block's start where allocate() made it,
  // or another allocator's context (a tensor made with from_blob or DLPack over expanse's
  // memory): the block is found by ctx, then by ptr.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    void* base = nullptr;
    size_t size = 0;
    if (stream.device_type() == at::DeviceType::CUDA &&
        (expanse_host_block_of(ctx, &base, &size) == EXPANSE_OK ||
         expanse_host_block_of(ptr, &base, &size) == EXPANSE_OK)) {
      // PyTorch's default stream is the legacy stream, which names the current context's: the
      // stream's device is made current so that the block remembers the right one.
      c10::DeviceIndex before = -1;
      try {
        const c10::DeviceIndex now = c10::cuda::current_device();
        if (now != stream.device_index()) {
          c10::cuda::set_device(stream.device_index());
          before = now;
        }
      } catch (const c10::Error&) {
        before = -1;  // no CUDA runtime to ask: the current context stands
      }
      CUstream_st* raw = nullptr;  // PyTorch's default stream: the legacy one
      bool known = true;
      try {
        const c10::cuda::CUDAStream cs(c10::cuda::CUDAStream::UNCHECKED, stream);
        raw = reinterpret_cast<CUstream_st*>(cs.stream());
      } catch (const c10::Error&) {
        known = stream.id() == 0;  // no CUDA runtime to ask (newer PyTorch asks even for 0)
      }
      const int rc = known ? expanse_host_record_stream(base, raw) : EXPANSE_EINVAL;
      if (before >= 0) {
        try {
          c10::cuda::set_device(before);
        } catch (const c10::Error&) {
        }
      }
      if (rc == EXPANSE_OK) return true;
    }
    // Not a block of expanse's: one PyTorch's own allocator pinned before this one was
    // installed, still ordered by it (pageable memory too: PyTorch asks for every non_blocking
    // copy, and its own allocator answers no).
    return previous_ != nullptr && previous_->record_event(ptr, ctx, stream);
  }

#if EXPANSE_TORCH_HOST_ALLOCATOR_HAS_POOLS
  // CUDA graphs (CUDAGraph::capture_begin / capture_end / reset): pinned blocks allocated on a
  // capturing stream are the graph's until its pool is released.
  // PyTorch counts a pool's uses (graphs share pools: g.pool(), graph_pool_handle(), cudagraph
  // trees): each begin is one more, each release_pool one less, and the pool's blocks go only
  // when none is left. Each capture is also announced to expanse (PyTorch calls begin before
  // cudaStreamBeginCapture, on the capture stream, and end after cudaStreamEndCapture), so that
  // no host request proves frees by a synchronize that would invalidate it.
  void begin_allocate_to_pool(c10::MempoolId_t pool_id,
                              std::function<bool(c10::Stream)> filter) override {
    CUstream_st* stream = nullptr;
    try {
      stream = reinterpret_cast<CUstream_st*>(c10::cuda::getCurrentCUDAStream().stream());
    } catch (const c10::Error&) {
      stream = nullptr;  // no CUDA runtime: nothing can capture
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = active_.begin(); it != active_.end(); ++it) {
      if (it->pool == pool_id) {  // begun again without an end (a capture that failed)
        if (it->announced) expanse_capture_end(it->stream);
        active_.erase(it);
        break;
      }
    }
    const bool announced = stream != nullptr && expanse_capture_begin(stream) == EXPANSE_OK;
    active_.push_back({pool_id, std::move(filter), stream, announced});
    ++uses_[pool_id];
  }

  void end_allocate_to_pool(c10::MempoolId_t pool_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = active_.begin(); it != active_.end(); ++it) {
      if (it->pool == pool_id) {
        if (it->announced) expanse_capture_end(it->stream);
        active_.erase(it);
        break;
      }
    }
  }

  void release_pool(c10::MempoolId_t pool_id) override {
    std::vector<void*> freed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto u = uses_.find(pool_id);
      if (u == uses_.end() || --u->second > 0) return;  // another graph still uses the pool
      uses_.erase(u);
      auto h = held_.find(pool_id);
      if (h != held_.end()) {
        freed = std::move(h->second);
        held_.erase(h);
      }
      // Blocks still live leave the pool: their deleter frees them as any other.
      for (auto it = captured_.begin(); it != captured_.end();) {
        if (it->second == pool_id) {
          it = captured_.erase(it);
          tagged_.fetch_sub(1, std::memory_order_release);
        } else {
          ++it;
        }
      }
    }
    // The graphs are gone, but replays issued before may still run, on any stream: after every
    // stream of the device, whatever the capture recorded.
    for (void* p : freed) expanse_host_free_after_device(p, -1, EXPANSE_HOST_EVERY_STREAM);
  }
#endif  // EXPANSE_TORCH_HOST_ALLOCATOR_HAS_POOLS

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
    out.num_host_alloc = static_cast<int64_t>(s.num_created_pages - created_base_.load());
    out.num_host_free = static_cast<int64_t>(s.num_released_pages - released_base_.load());
    return out;
  }

  void reset_accumulated_stats() override {
    expanse_host_stats s{};
    s.struct_size = sizeof s;
    if (expanse_host_get_stats(-1, &s) != EXPANSE_OK) return;
    allocs_base_ = s.num_allocs;
    frees_base_ = s.num_frees;
    created_base_ = s.num_created_pages;
    released_base_ = s.num_released_pages;
  }

  void reset_peak_stats() override { expanse_host_reset_peak_stats(); }

 private:
  void tag_if_captured(void* p, c10::Stream current) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Routing& r : active_) {
      if (r.filter(current)) {
        captured_.emplace(p, r.pool);
        tagged_.fetch_add(1, std::memory_order_release);
        return;
      }
    }
  }

  at::HostAllocator* previous_;
  std::atomic<uint64_t> allocs_base_{0};
  std::atomic<uint64_t> frees_base_{0};
  std::atomic<uint64_t> created_base_{0};
  std::atomic<uint64_t> released_base_{0};

  struct Routing {
    c10::MempoolId_t pool;
    std::function<bool(c10::Stream)> filter;
    CUstream_st* stream = nullptr;  // the capture stream, announced to expanse
    bool announced = false;
  };

  std::mutex mu_;
  std::vector<Routing> active_;
  std::map<c10::MempoolId_t, int> uses_;  // begins less releases, per pool
  std::map<void*, c10::MempoolId_t> captured_;                 // live blocks of a capture
  std::map<c10::MempoolId_t, std::vector<void*>> held_;        // freed, kept for their graph
  std::atomic<size_t> tagged_{0};                              // captured_.size()
};

ExpanseHostAllocator* g_host = nullptr;

void free_host_block(void* ctx) {
  if (ctx != nullptr && g_host != nullptr) g_host->free_block(ctx);
}
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
