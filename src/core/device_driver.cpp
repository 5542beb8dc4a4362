#include "core/device_driver.hpp"

#include <cassert>

namespace expanse::core {

using driver::EntryPoint;

DeviceDriver::DeviceDriver(const driver::LoadedDriver& drv, int device)
    : drv_(drv), t_(drv.table()), device_(device) {
  int count = 0;
  check(t_.device_get_count(&count), EntryPoint::device_get_count);
  if (device < 0 || device >= count) {
    throw driver::driver_error("device " + std::to_string(device) + " does not exist (" +
                                   std::to_string(count) + " device" + (count == 1 ? "" : "s") +
                                   ")",
                               CUDA_ERROR_INVALID_DEVICE);
  }
  CUdevice dev = 0;
  check(t_.device_get(&dev, device), EntryPoint::device_get);
  int vmm = 0;
  check(t_.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
        EntryPoint::device_get_attribute);
  if (vmm == 0) {
    throw driver::driver_error("device " + std::to_string(device) +
                                   " does not support CUDA virtual memory management",
                               CUDA_ERROR_NOT_SUPPORTED);
  }
  check(t_.device_total_mem(&total_memory_, dev), EntryPoint::device_total_mem);
  check(t_.device_primary_ctx_retain(&ctx_, dev), EntryPoint::device_primary_ctx_retain);

  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = dev;
  check(t_.mem_get_allocation_granularity(&granularity_, &prop_,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        EntryPoint::mem_get_allocation_granularity);
  access_.location = prop_.location;
  access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

DeviceDriver::~DeviceDriver() {
  if (ctx_ != nullptr) t_.device_primary_ctx_release(device_);
}

// Start-up queries (device count, attributes, granularity) are not counted: stats describe the
// allocator's work, and those calls happen once per device whatever it does.
void DeviceDriver::count(EntryPoint e, size_t bytes, size_t mappings) {
  ++calls_[static_cast<int>(e)];
  modeled_ns_ += driver::CostModel::get_default().cost_ns(e, bytes, mappings);
}

DeviceDriver::ScopedContext::ScopedContext(DeviceDriver& d) : d_(d) {
  CUcontext cur = nullptr;
  d_.count(EntryPoint::ctx_get_current, 0);
  d_.check(d_.t_.ctx_get_current(&cur), EntryPoint::ctx_get_current);
  if (cur != d_.ctx_) {
    d_.count(EntryPoint::ctx_push_current, 0);
    d_.check(d_.t_.ctx_push_current(d_.ctx_), EntryPoint::ctx_push_current);
    pushed_ = true;
  }
}

DeviceDriver::ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    d_.count(EntryPoint::ctx_pop_current, 0);
    d_.t_.ctx_pop_current(&popped);
  }
}

CUdeviceptr DeviceDriver::reserve(size_t size, size_t alignment) {
  CUdeviceptr va = 0;
  count(EntryPoint::mem_address_reserve, 0);
  CUresult r = t_.mem_address_reserve(&va, size, alignment, 0, 0);
  check(r, EntryPoint::mem_address_reserve);
  return va;
}

void DeviceDriver::address_free(CUdeviceptr va, size_t size) {
  count(EntryPoint::mem_address_free, 0);
  check(t_.mem_address_free(va, size), EntryPoint::mem_address_free);
}

CUresult DeviceDriver::create(size_t size, CUmemGenericAllocationHandle* out) {
  count(EntryPoint::mem_create, size);
  CUresult r = t_.mem_create(out, size, &prop_, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) check(r, EntryPoint::mem_create);
  return r;
}

void DeviceDriver::release(CUmemGenericAllocationHandle h, size_t size) {
  count(EntryPoint::mem_release, size);
  check(t_.mem_release(h), EntryPoint::mem_release);
}

void DeviceDriver::map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  count(EntryPoint::mem_map, size);
  check(t_.mem_map(va, size, 0, h, 0), EntryPoint::mem_map);
}

void DeviceDriver::unmap(CUdeviceptr va, size_t size, size_t mappings) {
  count(EntryPoint::mem_unmap, size, mappings);
  check(t_.mem_unmap(va, size), EntryPoint::mem_unmap);
}

void DeviceDriver::set_access(CUdeviceptr va, size_t size, size_t mappings) {
  count(EntryPoint::mem_set_access, size, mappings);
  check(t_.mem_set_access(va, size, &access_, 1), EntryPoint::mem_set_access);
}

CUevent DeviceDriver::event_create() {
  ScopedContext scope(*this);
  CUevent e = nullptr;
  count(EntryPoint::event_create, 0);
  check(t_.event_create(&e, CU_EVENT_DISABLE_TIMING), EntryPoint::event_create);
  return e;
}

void DeviceDriver::event_destroy(CUevent e) {
  ScopedContext scope(*this);
  count(EntryPoint::event_destroy, 0);
  check(t_.event_destroy(e), EntryPoint::event_destroy);
}

void DeviceDriver::event_record(CUevent e, CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::event_record, 0);
  check(t_.event_record(e, s), EntryPoint::event_record);
}

bool DeviceDriver::event_record_or_synchronize(CUevent e, CUstream s) {
  ScopedContext scope(*this);
  count(EntryPoint::event_record, 0);
  CUresult r = t_.event_record(e, s);
  if (r == CUDA_SUCCESS) return true;
  if (r != CUDA_ERROR_INVALID_HANDLE) check(r, EntryPoint::event_record);
  count(EntryPoint::ctx_synchronize, 0);
  check(t_.ctx_synchronize(), EntryPoint::ctx_synchronize);
  return false;
}

void DeviceDriver::ctx_synchronize() {
  ScopedContext scope(*this);
  count(EntryPoint::ctx_synchronize, 0);
  check(t_.ctx_synchronize(), EntryPoint::ctx_synchronize);
}

bool DeviceDriver::event_query(CUevent e) {
  count(EntryPoint::event_query, 0);
  CUresult r = t_.event_query(e);
  if (r == CUDA_ERROR_NOT_READY) return false;
  check(r, EntryPoint::event_query);
  return true;
}

void DeviceDriver::event_synchronize(CUevent e) {
  count(EntryPoint::event_synchronize, 0);
  check(t_.event_synchronize(e), EntryPoint::event_synchronize);
}

}  // namespace expanse::core
