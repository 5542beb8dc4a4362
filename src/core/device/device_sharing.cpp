// DeviceDriver's sharing calls: export and import of physical handles as POSIX file descriptors.
#include "core/device/device_driver.hpp"

#include <cstdint>

namespace expanse::core {

using driver::EntryPoint;

CUresult DeviceDriver::export_fd(CUmemGenericAllocationHandle h, int* fd) {
  ScopedContext scope(*this);
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_export_to_shareable_handle, 0);
  return t_.mem_export_to_shareable_handle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

CUresult DeviceDriver::import_fd(int fd, CUmemGenericAllocationHandle* h) {
  ScopedContext scope(*this);
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_import_from_shareable_handle, 0);
  // The fd goes by value, cast to a pointer (cuda.h; PyTorch and NCCL do the same).
  return t_.mem_import_from_shareable_handle(h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

CUresult DeviceDriver::handle_device(CUmemGenericAllocationHandle h, int* device) {
  ScopedContext scope(*this);
  CUmemAllocationProp prop{};
  count(EntryPoint::mem_get_allocation_properties_from_handle, 0);
  const CUresult r = t_.mem_get_allocation_properties_from_handle(&prop, h);
  if (r == CUDA_SUCCESS) *device = prop.location.id;
  return r;
}

}  // namespace expanse::core
