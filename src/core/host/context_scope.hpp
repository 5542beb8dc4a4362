// A context made current for the driver calls of one entry point, the caller's put back after:
// the host pools' VMM calls and events run in the context of the device that first asked.
#pragma once

#include "driver_api/driver_table.hpp"

#include <cuda.h>

namespace expanse::core {

class ContextScope {
 public:
  ContextScope(const driver::DriverTable& t, CUcontext ctx) : t_(t), pushed_(ctx != nullptr) {
    if (pushed_ && t_.ctx_push_current(ctx) != CUDA_SUCCESS) pushed_ = false;
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (pushed_) t_.ctx_pop_current(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const driver::DriverTable& t_;
  bool pushed_;
};

// The calling thread's current context, or `fallback` where it has none.
inline CUcontext current_or(const driver::DriverTable& t, CUcontext fallback) {
  CUcontext ctx = nullptr;
  return t.ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr ? ctx : fallback;
}

}  // namespace expanse::core
