// The C++ facade: the same operations as the C ABI, with exceptions.
#include "api/errors.hpp"
#include "api/pool_registry.hpp"
#include "api/runtime.hpp"
#include "api/c_stats.hpp"
#include "expanse/expanse.hpp"

namespace expanse {

using api::Runtime;

std::map<std::string, uint64_t> Stats::driver_calls_by_name() const {
  std::map<std::string, uint64_t> out;
  for (uint32_t i = 0; i < num_entry_points; ++i) {
    if (driver_calls[i] != 0) out[expanse_entry_point_name(static_cast<int>(i))] = driver_calls[i];
  }
  return out;
}

void init(const std::string& conf) { Runtime::init(conf); }
void shutdown() { Runtime::shutdown(); }
std::string driver_description() { return Runtime::get().driver().description(); }
int device_count() { return Runtime::get().device_count(); }

void* allocate(size_t bytes, int device, stream_t stream) {
  return api::routed_allocate(bytes, device, reinterpret_cast<CUstream>(stream));
}

void deallocate(void* ptr, int device, stream_t stream) {
  if (ptr == nullptr) return;
  api::free_on_device(ptr, 0, device, reinterpret_cast<CUstream>(stream));
}

void record_stream(void* ptr, stream_t stream) {
  api::owner_of(ptr, "record_stream").record_stream(ptr, reinterpret_cast<CUstream>(stream));
}

void* host_allocate(size_t bytes, int numa_node, stream_t stream) {
  if (api::in_forked_child()) throw driver_failure(api::forked_child_message("host_allocate"), 0);
  return Runtime::get().host().allocate(bytes, numa_node, reinterpret_cast<CUstream>(stream));
}

void host_deallocate(void* ptr, stream_t stream) {
  if (ptr == nullptr) return;
  Runtime::get().host().free(ptr, reinterpret_cast<CUstream>(stream));
}

void host_deallocate_after_device(void* ptr, int device) {
  if (ptr == nullptr) return;
  Runtime::get().host().free_after_device(ptr, device, false);
}

void host_record_stream(void* ptr, stream_t stream) {
  Runtime::get().host().record_stream(ptr, reinterpret_cast<CUstream>(stream));
}

void host_release_cached() { Runtime::get().host().release_cached(); }

host_stats_t host_stats(int numa_node) {
  host_stats_t s{};
  s.struct_size = sizeof s;
  // One conversion from the pools' figures: the C ABI's.
  if (expanse_host_get_stats(numa_node, &s) != EXPANSE_OK) {
    throw usage_error(expanse_last_error());
  }
  return s;
}

device_allocator::device_allocator(int device) : device_(device) {
  (void)Runtime::get().device(device);  // fail early on a bad device
}

void* device_allocator::allocate(size_t bytes, stream_t stream) const {
  return expanse::allocate(bytes, device_, stream);
}
void device_allocator::deallocate(void* ptr, stream_t stream) const {
  expanse::deallocate(ptr, device_, stream);
}
void device_allocator::record_stream(void* ptr, stream_t stream) const {
  expanse::record_stream(ptr, stream);
}
void device_allocator::release_cached() const { Runtime::get().device(device_).release_cached(); }
size_t device_allocator::reserve(size_t bytes) const {
  return Runtime::get().device(device_).reserve(bytes);
}
void device_allocator::unreserve() const { Runtime::get().device(device_).reserve(0); }
void device_allocator::set_limit(size_t bytes) const {
  Runtime::get().device(device_).set_limit(bytes);
}
Stats device_allocator::stats() const {
  Stats s{};
  s.struct_size = sizeof(expanse_stats);
  api::fill_stats(device_, &s);
  return s;
}
void device_allocator::reset_peak_stats() const { Runtime::get().device(device_).reset_peaks(); }

pool::pool(int device) : id_(api::pool_create(device)), device_(device) {}

pool::~pool() {
  try {
    release();
  } catch (...) {
    // A destructor never throws; the pool stays in use (the runtime was reconfigured, say).
  }
}

pool::pool(pool&& other) noexcept : id_(other.id_), device_(other.device_) { other.id_ = 0; }

pool& pool::operator=(pool&& other) noexcept {
  if (this != &other) {
    try {
      release();
    } catch (...) {
    }
    id_ = other.id_;
    device_ = other.device_;
    other.id_ = 0;
  }
  return *this;
}

pool_stats pool::stats() const {
  if (id_ == 0) throw usage_error("expanse::pool::stats: the pool was released or moved from");
  return api::pool_stats(id_);
}

void* pool::allocate(size_t bytes, stream_t stream) const {
  if (id_ == 0) throw usage_error("expanse::pool::allocate: the pool was released or moved from");
  return api::pool_malloc(id_, bytes, reinterpret_cast<CUstream>(stream));
}

bool pool::sleep(bool offload, stream_t stream) const {
  if (id_ == 0) throw usage_error("expanse::pool::sleep: the pool was released or moved from");
  return api::pool_sleep(id_, offload ? EXPANSE_SLEEP_OFFLOAD : EXPANSE_SLEEP_DISCARD,
                         reinterpret_cast<CUstream>(stream));
}

bool pool::sleep_zeroed(stream_t stream) const {
  if (id_ == 0) {
    throw usage_error("expanse::pool::sleep_zeroed: the pool was released or moved from");
  }
  return api::pool_sleep(id_, EXPANSE_SLEEP_DISCARD | EXPANSE_SLEEP_ZERO_ON_WAKE,
                         reinterpret_cast<CUstream>(stream));
}

void pool::wake(stream_t stream) const {
  if (id_ == 0) throw usage_error("expanse::pool::wake: the pool was released or moved from");
  api::pool_wake(id_, reinterpret_cast<CUstream>(stream));
}

bool pool::asleep() const {
  if (id_ == 0) throw usage_error("expanse::pool::asleep: the pool was released or moved from");
  return api::pool_is_asleep(id_);
}

void pool::release() {
  if (id_ == 0) return;
  const expanse_pool_id id = id_;
  id_ = 0;
  api::pool_release(id);
}

pool_scope::pool_scope(const pool& p) : route_(api::pool_begin_thread(p.id())) {}
pool_scope::~pool_scope() {
  try {
    api::pool_end_route(route_);
  } catch (...) {
  }
}

capture_scope::capture_scope(const pool& p, stream_t stream)
    : route_(api::pool_begin_capture(p.id(), reinterpret_cast<CUstream>(stream))) {}
capture_scope::~capture_scope() {
  try {
    api::pool_end_route(route_);
  } catch (...) {
  }
}

}  // namespace expanse
