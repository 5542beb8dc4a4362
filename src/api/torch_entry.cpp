// expanse_torch_malloc / expanse_torch_free: the pair to give PyTorch's CUDAPluggableAllocator.
//
// PyTorch keeps the pointer alloc_fn returns without checking it (CUDAPluggableAllocator::malloc,
// torch/csrc/cuda/CUDAPluggableAllocator.cpp): a NULL becomes a tensor at address 0. So failure
// is a C++ exception here. It propagates out of CUDAPluggableAllocator::malloc/allocate
// unchanged, and PyTorch's Python bindings (END_HANDLE_TH_ERRORS, torch/csrc/Exceptions.h) turn
// any std::exception that is not one of c10's into a RuntimeError carrying what(). The type
// derives from std::runtime_error, not std::bad_alloc: pybind11 maps std::bad_alloc to
// MemoryError. (torch.cuda.OutOfMemoryError needs c10::OutOfMemoryError, which only code linked
// against libc10 can throw.) The message starts with PyTorch's own "CUDA out of memory. Tried to
// allocate ...", which batch-size finders and retry loops match.
//
// free_fn runs in tensor destructors and must not throw; PyTorch may pass a stale size
// (pytorch/pytorch#153109), so the block is found by pointer alone.
#include "api/torch_entry.hpp"

#include "api/errors.hpp"
#include "api/oom_message.hpp"
#include "api/pool_registry.hpp"
#include "api/runtime.hpp"
#include "api/c_stats.hpp"
#include "expanse/expanse.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace expanse::api {

// Thrown by expanse_torch_malloc. Default visibility: its type information is the same in every
// module that catches it (libexpanse.so is otherwise built with hidden symbols).
class EXPANSE_API torch_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace {

std::mutex g_counts_mu;
std::map<int, TorchFreeCounts> g_counts;
std::atomic<bool> g_mismatch_reported{false};

std::string ptr_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

[[noreturn]] void throw_oom(size_t size, int device, const std::string& why) {
  expanse_stats s{};
  s.struct_size = sizeof s;
  try {
    fill_stats(device, &s);
  } catch (...) {
    s = expanse_stats{};  // no figures
  }
  throw torch_error(oom_message(size, device, s, why));
}

void count(int device, bool mismatch) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  TorchFreeCounts& c = g_counts[device];
  ++(mismatch ? c.size_mismatches : c.unknown);
}

void report(const std::string& m) noexcept {
  std::fprintf(stderr, "%s\n", m.c_str());
  std::fflush(stderr);
}

}  // namespace

TorchFreeCounts torch_free_counts(int device) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  auto it = g_counts.find(device);
  return it == g_counts.end() ? TorchFreeCounts{} : it->second;
}

}  // namespace expanse::api

using expanse::api::Runtime;
using expanse::api::torch_error;

extern "C" {

EXPANSE_C_API void* expanse_torch_malloc(size_t size, int device, struct CUstream_st* stream) {
  if (size == 0) return nullptr;
  try {
    if (expanse::api::in_forked_child()) {
      throw expanse::driver_failure(expanse::api::forked_child_message("expanse_torch_malloc"), 0);
    }
    void* p = expanse::api::routed_allocate(size, device, reinterpret_cast<CUstream>(stream));
    if (p == nullptr) throw expanse::driver_failure("expanse: allocation returned no pointer", 0);
    return p;
  } catch (const expanse::out_of_memory& e) {
    expanse::api::last_error() = e.what();
    expanse::api::throw_oom(size, device, e.what());
  } catch (const torch_error&) {
    throw;
  } catch (const std::exception& e) {
    expanse::api::last_error() = e.what();
    throw torch_error(std::string("expanse_torch_malloc(") + std::to_string(size) +
                      " bytes, device " + std::to_string(device) + "): " + e.what());
  }
}

EXPANSE_C_API void expanse_torch_free(void* ptr, size_t size, int device,
                                      struct CUstream_st* stream) {
  if (ptr == nullptr) return;
  // A forked child's tensors are its parent's blocks, freed at its exit: nothing to do here (the
  // books are a copy; the driver cannot be used).
  if (expanse::api::in_forked_child()) {
    expanse::api::last_error() = expanse::api::forked_child_message("expanse_torch_free");
    return;
  }
  try {
    Runtime& rt = Runtime::get();
    expanse::core::DeviceAllocator* owner = nullptr;
    size_t recorded = 0;
    expanse::core::DeviceAllocator* named = rt.existing(device);
    if (named != nullptr && named->owns(ptr, &recorded)) owner = named;
    for (int d = 0; owner == nullptr && d < rt.device_count(); ++d) {
      expanse::core::DeviceAllocator* a = rt.existing(d);
      if (a != nullptr && a != named && a->owns(ptr, &recorded)) owner = a;
    }
    if (owner == nullptr) {
      expanse::api::count(device, false);
      expanse::api::report("expanse_torch_free: " + expanse::api::ptr_text(ptr) + " (size " +
                           std::to_string(size) + ", device " + std::to_string(device) +
                           ") is not a live block on any device; ignored");
      return;
    }
    if (size != recorded) {
      expanse::api::count(owner->device(), true);
      if (!expanse::api::g_mismatch_reported.exchange(true)) {
        expanse::api::report(
            "expanse_torch_free: " + expanse::api::ptr_text(ptr) + " freed with size " +
            std::to_string(size) + ", but it was allocated with size " + std::to_string(recorded) +
            "; freed by pointer (some PyTorch versions pass a stale size, pytorch/pytorch#153109)."
            " Later mismatches are counted in expanse_stats.num_free_size_mismatches, not printed.");
      }
    }
    const CUstream s = reinterpret_cast<CUstream>(stream);
    owner->deallocate(ptr, s, 0, expanse::api::join_for_free(owner->device(), s));
  } catch (const std::exception& e) {
    expanse::api::last_error() = e.what();
    expanse::api::report(std::string("expanse_torch_free: ") + e.what());
  } catch (...) {
    expanse::api::report("expanse_torch_free: unknown error");
  }
}

}  // extern "C"
