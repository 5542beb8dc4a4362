// The C++ facade: the same operations as the C ABI, with exceptions.
#include "api/errors.hpp"
#include "api/runtime.hpp"
#include "api/stats.hpp"
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
  return Runtime::get().device(device).allocate(bytes, reinterpret_cast<CUstream>(stream));
}

void deallocate(void* ptr, int device, stream_t stream) {
  if (ptr == nullptr) return;
  api::free_on_device(ptr, 0, device, reinterpret_cast<CUstream>(stream));
}

void record_stream(void* ptr, stream_t stream) {
  api::owner_of(ptr, "record_stream").record_stream(ptr, reinterpret_cast<CUstream>(stream));
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

}  // namespace expanse
