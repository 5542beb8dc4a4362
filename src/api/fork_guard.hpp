// A child forked after this process initialised the CUDA driver can never use it (NVIDIA: no
// CUDA call in a child forked after cuInit; the driver answers CUDA_ERROR_INITIALIZATION_ERROR,
// or worse, a lock another thread held at the fork never opens). Every entry point that could
// reach the driver or the allocator's books checks this first and fails with a message that says
// what happened and what to do, instead of touching state copied in the middle of a parent's call.
#pragma once

#include <atomic>
#include <string>

namespace expanse::api {

// Called once the driver is initialised (the runtime's constructor): from here on, a fork's child
// is marked (pthread_atfork). Cheap to call again.
void note_driver_initialised() noexcept;
namespace detail {
inline std::atomic<bool> forked_child{false};  // set by the pthread_atfork child handler
}  // namespace detail

// Whether this process is a child forked after the driver was initialised in an ancestor. One
// relaxed atomic load, inline: entry points on the hot path call it.
inline bool in_forked_child() noexcept {
  return detail::forked_child.load(std::memory_order_relaxed);
}
// The error for `what` (an entry point's name, or empty) called in such a child.
std::string forked_child_message(const char* what);

}  // namespace expanse::api
