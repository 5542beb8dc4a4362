// Turning exceptions into C error codes, and the pieces the C and C++ APIs share.
#pragma once

#include "api/fork_guard.hpp"
#include "core/device_allocator.hpp"
#include "expanse/errors.hpp"
#include "expanse/expanse.h"

#include <string>

namespace expanse::api {

// The calling thread's last error message.
std::string& last_error();

// Runs f; returns EXPANSE_OK, or the code for the exception it threw (message kept in
// last_error()). Never throws. In a child forked after the driver was initialised, f is not run:
// EXPANSE_EDRIVER, saying so (fork_guard.hpp).
template <class F>
int guarded(F&& f) noexcept {
  try {
    if (in_forked_child()) {
      last_error() = forked_child_message(nullptr);
      return EXPANSE_EDRIVER;
    }
    f();
    return EXPANSE_OK;
  } catch (const out_of_memory& e) {
    last_error() = e.what();
    return EXPANSE_ENOMEM;
  } catch (const usage_error& e) {
    last_error() = e.what();
    return EXPANSE_EINVAL;
  } catch (const driver_failure& e) {
    last_error() = e.what();
    return EXPANSE_EDRIVER;
  } catch (const std::bad_alloc&) {
    last_error() = "expanse: out of host memory";
    return EXPANSE_ENOMEM;
  } catch (const std::exception& e) {
    last_error() = std::string("expanse: ") + e.what();
    return EXPANSE_EDRIVER;
  } catch (...) {
    last_error() = "expanse: unknown error";
    return EXPANSE_EDRIVER;
  }
}

// Frees ptr on device after checking it is live there with that size (0: any size). Names the
// device that does own it when it is another one.
void free_on_device(void* ptr, size_t size, int device, CUstream stream);
// The allocator that holds ptr as a live block; throws usage_error naming `what` otherwise.
core::DeviceAllocator& owner_of(void* ptr, const char* what);

}  // namespace expanse::api
