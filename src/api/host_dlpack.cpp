// expanse_host_dlpack: a pinned host block as a DLPack tensor, so that torch.from_dlpack,
// numpy.from_dlpack and their peers take it without a copy, and the tensor's last reference
// frees it from any thread, with no interpreter lock and no Python left (the deleter is C).
#include "api/errors.hpp"
#include "api/host_pools.hpp"
#include "api/runtime.hpp"
#include "expanse/expanse.h"

#include <cstdint>
#include <new>

using expanse::api::guarded;
using expanse::api::Runtime;

namespace {

// DLPack's unversioned ABI (DLPack 0.x, "dltensor" capsules): the layout consumers read. Written
// out here rather than included: the project needs no DLPack headers to build.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;  // pinned host memory is CPU memory to DLPack's consumers
constexpr uint8_t kDLUInt = 1;

// One allocation holds the tensor and the arrays it points into.
struct HostTensor {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  int64_t strides[1] = {1};
  int device = -1;
};

extern "C" void delete_host_tensor(DLManagedTensor* self) {
  if (self == nullptr) return;
  auto* t = static_cast<HostTensor*>(self->manager_ctx);
  // A failure (the runtime shut down meanwhile, a forked child) is in expanse_last_error; the
  // block stays the pool's, live, and nothing else is touched.
  expanse_host_free_after_device(t->managed.dl_tensor.data, t->device, 0);
  delete t;
}

}  // namespace

extern "C" {

EXPANSE_C_API int expanse_host_dlpack(void* ptr, int device, void** managed_tensor) {
  if (managed_tensor == nullptr) {
    expanse::api::last_error() = "expanse_host_dlpack: managed_tensor must not be NULL";
    return EXPANSE_EINVAL;
  }
  *managed_tensor = nullptr;
  return guarded([&] {
    Runtime::get().host().check_device(device, ptr, "expanse_host_dlpack");
    const size_t size = Runtime::get().host().live_size(ptr, "expanse_host_dlpack");
    auto* t = new HostTensor;
    t->shape[0] = static_cast<int64_t>(size);
    t->device = device;
    DLTensor& dl = t->managed.dl_tensor;
    dl.data = ptr;
    dl.device = {kDLCPU, 0};
    dl.ndim = 1;
    dl.dtype = {kDLUInt, 8, 1};
    dl.shape = t->shape;
    dl.strides = t->strides;
    dl.byte_offset = 0;
    t->managed.manager_ctx = t;
    t->managed.deleter = delete_host_tensor;
    *managed_tensor = &t->managed;
  });
}

}  // extern "C"
