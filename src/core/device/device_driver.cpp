#include "core/device/device_driver.hpp"

#include <algorithm>
#include <cassert>

namespace expanse::core {

using driver::EntryPoint;

DeviceDriver::DeviceDriver(const driver::LoadedDriver& drv, int device, bool rdma)
    : drv_(drv), t_(drv.table()), device_(device) {
  int count = 0;
  check(t_.device_get_count(&count), EntryPoint::device_get_count);
  if (device < 0 || device >= count) {
    throw driver::driver_error("device " + std::to_string(device) + " does not exist (" +
                                   std::to_string(count) + " device" + (count == 1 ? "" : "s") +
                                   ")",
                               CUDA_ERROR_INVALID_DEVICE);
  }
  check(t_.device_get(&dev_, device), EntryPoint::device_get);
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    // An attribute the driver does not know (older than it) is "not supported".
    return t_.device_get_attribute(&v, a, dev_) == CUDA_SUCCESS && v != 0;
  };
  if (!attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
    throw driver::driver_error("device " + std::to_string(device) +
                                   " does not support CUDA virtual memory management",
                               CUDA_ERROR_NOT_SUPPORTED);
  }
  check(t_.device_total_mem(&total_memory_, dev_), EntryPoint::device_total_mem);
  check(t_.device_primary_ctx_retain(&ctx_, dev_), EntryPoint::device_primary_ctx_retain);
  has_ids_ = drv_.has(EntryPoint::stream_get_id);

  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = device;  // CUmemLocation names a device by its ordinal, not its CUdevice
  // Exportable to other processes (cuMemExportToShareableHandle) and registrable with a NIC
  // (NCCL, RDMA) — asked for only where the device says so: elsewhere cuMemCreate refuses, and on
  // WSL2 an RDMA-capable allocation makes cuMemSetAccess fail (pytorch/pytorch#192330).
  if (attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)) {
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  }
  if (rdma && attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)) {
    prop_.allocFlags.gpuDirectRDMACapable = 1;
  }
  check(t_.mem_get_allocation_granularity(&granularity_, &prop_,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        EntryPoint::mem_get_allocation_granularity);
  CUmemAccessDesc own{};
  own.location = prop_.location;
  own.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access_.push_back(own);
  if (prop_.allocFlags.gpuDirectRDMACapable != 0 && !rdma_mapping_works()) {
    prop_.allocFlags.gpuDirectRDMACapable = 0;
  }
}

// WSL2's driver (before R615) says GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 1, creates and maps
// RDMA-capable memory, then fails cuMemSetAccess on it (pytorch/pytorch#192330, an NVIDIA driver
// bug). Rather than guess the platform, one page is taken through the whole sequence once per
// device: if setting access fails with the flag and works without it, the flag is dropped and
// memory is still usable (just not registrable with a NIC, which WSL2 offers no path to). Any
// other outcome keeps the flag, and real failures surface where they happen. Not counted in the
// stats, like the other start-up queries.
bool DeviceDriver::rdma_mapping_works() {
  // Raw calls (no counting, no ScopedContext): nothing here may show in the stats.
  if (t_.ctx_push_current(ctx_) != CUDA_SUCCESS) return true;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;  // not a capture's business
  const bool relaxed = t_.thread_exchange_stream_capture_mode != nullptr &&
                       t_.thread_exchange_stream_capture_mode(&mode) == CUDA_SUCCESS;
  // Only a refused cuMemSetAccess counts against the flag: a failure to reserve, create or map
  // (out of memory, say), or memory running out at set-access, proves nothing about it.
  auto sequence_works = [&](const CUmemAllocationProp& prop) {
    CUdeviceptr va = 0;
    if (t_.mem_address_reserve(&va, granularity_, 0, 0, 0) != CUDA_SUCCESS) return true;
    CUmemGenericAllocationHandle h = 0;
    bool ok = true;
    if (t_.mem_create(&h, granularity_, &prop, 0) == CUDA_SUCCESS) {
      if (t_.mem_map(va, granularity_, 0, h, 0) == CUDA_SUCCESS) {
        const CUresult r = t_.mem_set_access(va, granularity_, access_.data(), 1);
        ok = r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY;
        t_.mem_unmap(va, granularity_);
      }
      t_.mem_release(h);
    }
    t_.mem_address_free(va, granularity_);
    return ok;
  };
  bool works = sequence_works(prop_);
  if (!works) {
    CUmemAllocationProp plain = prop_;
    plain.allocFlags.gpuDirectRDMACapable = 0;
    works = !sequence_works(plain);
  }
  if (relaxed) t_.thread_exchange_stream_capture_mode(&mode);
  CUcontext popped = nullptr;
  t_.ctx_pop_current(&popped);
  return works;
}

DeviceDriver::~DeviceDriver() {
  // The CUdevice from cuDeviceGet, not the ordinal: the driver promises nothing about their
  // relation.
  if (ctx_ != nullptr) t_.device_primary_ctx_release(dev_);
  for (CUdevice d : peer_devs_) t_.device_primary_ctx_release(d);
}

// Start-up queries (device count, attributes, granularity) are not counted: stats describe the
// allocator's work, and those calls happen once per device whatever it does.
void DeviceDriver::count(EntryPoint e, size_t bytes, size_t mappings, size_t times) {
  ++calls_[static_cast<int>(e)];
  modeled_ns_ += driver::CostModel::get_default().cost_ns(e, bytes, mappings) *
                 static_cast<double>(times);
}

DeviceDriver::ScopedContext::ScopedContext(DeviceDriver& d, CUcontext ctx) : d_(d) {
  CUcontext cur = nullptr;
  d_.count(EntryPoint::ctx_get_current, 0);
  if (d_.t_.ctx_get_current(&cur) == CUDA_SUCCESS && cur == ctx) return;
  d_.count(EntryPoint::ctx_push_current, 0);
  pushed_ = d_.t_.ctx_push_current(ctx) == CUDA_SUCCESS;
  ok_ = pushed_;
}

DeviceDriver::ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    d_.count(EntryPoint::ctx_pop_current, 0);
    d_.t_.ctx_pop_current(&popped);
  }
}

DeviceDriver::RelaxedCapture::RelaxedCapture(DeviceDriver& d) : d_(d) {
  if (d_.t_.thread_exchange_stream_capture_mode == nullptr) return;
  ++d_.stream_queries_;
  switched_ = d_.t_.thread_exchange_stream_capture_mode(&old_) == CUDA_SUCCESS;
}

DeviceDriver::RelaxedCapture::~RelaxedCapture() {
  if (!switched_) return;
  ++d_.stream_queries_;
  d_.t_.thread_exchange_stream_capture_mode(&old_);
}

CUdeviceptr DeviceDriver::reserve(size_t size, size_t alignment) {
  RelaxedCapture relaxed(*this);
  CUdeviceptr va = 0;
  count(EntryPoint::mem_address_reserve, 0);
  CUresult r = t_.mem_address_reserve(&va, size, alignment, 0, 0);
  check(r, EntryPoint::mem_address_reserve);
  return va;
}

void DeviceDriver::address_free(CUdeviceptr va, size_t size) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_address_free, 0);
  check(t_.mem_address_free(va, size), EntryPoint::mem_address_free);
}

CUresult DeviceDriver::create(size_t size, CUmemGenericAllocationHandle* out) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_create, size);
  CUresult r = t_.mem_create(out, size, &prop_, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) check(r, EntryPoint::mem_create);
  if (r == CUDA_SUCCESS) held_ += size;
  return r;
}

size_t DeviceDriver::free_memory() {
  ScopedContext scope(*this);
  if (!scope.ok()) check(CUDA_ERROR_INVALID_CONTEXT, EntryPoint::mem_get_info);
  count(EntryPoint::mem_get_info, 0);
  size_t free_bytes = 0, total = 0;
  check(t_.mem_get_info(&free_bytes, &total), EntryPoint::mem_get_info);
  return free_bytes;
}

void DeviceDriver::release(CUmemGenericAllocationHandle h, size_t size) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_release, size);
  check(t_.mem_release(h), EntryPoint::mem_release);
  held_ -= std::min(held_, size);
  low_water_ = std::min(low_water_, held_);
}

void DeviceDriver::release_imported(CUmemGenericAllocationHandle h, size_t size) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_release, size);
  check(t_.mem_release(h), EntryPoint::mem_release);
}

void DeviceDriver::map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_map, size);
  check(t_.mem_map(va, size, 0, h, 0), EntryPoint::mem_map);
}

void DeviceDriver::unmap(CUdeviceptr va, size_t size, size_t mappings) {
  RelaxedCapture relaxed(*this);
  count(EntryPoint::mem_unmap, size, mappings);
  check(t_.mem_unmap(va, size), EntryPoint::mem_unmap);
}

void DeviceDriver::set_access(CUdeviceptr va, size_t size, size_t mappings) {
  RelaxedCapture relaxed(*this);
  // One descriptor per device with access: each is priced as one pass over the mappings.
  count(EntryPoint::mem_set_access, size, mappings, access_.size());
  check(t_.mem_set_access(va, size, access_.data(), access_.size()), EntryPoint::mem_set_access);
}

bool DeviceDriver::can_access_peer(int peer) {
  if (peer == device_) return false;
  CUdevice p = 0;
  if (t_.device_get(&p, peer) != CUDA_SUCCESS) return false;
  int can = 0;
  // Whether `peer` can access memory of this device.
  return t_.device_can_access_peer(&can, p, dev_) == CUDA_SUCCESS && can != 0;
}

void DeviceDriver::add_peer(int peer) {
  if (has_peer(peer)) return;
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = peer;  // an ordinal, as in every CUmemLocation
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access_.push_back(d);
  peers_.push_back(peer);
}

const std::vector<CUcontext>& DeviceDriver::peer_contexts() {
  while (peer_ctxs_.size() < peers_.size()) {
    CUdevice pd = 0;
    CUcontext pctx = nullptr;
    check(t_.device_get(&pd, peers_[peer_ctxs_.size()]), EntryPoint::device_get);
    check(t_.device_primary_ctx_retain(&pctx, pd), EntryPoint::device_primary_ctx_retain);
    peer_devs_.push_back(pd);
    peer_ctxs_.push_back(pctx);
  }
  return peer_ctxs_;
}

bool DeviceDriver::has_peer(int peer) const {
  for (int p : peers_) {
    if (p == peer) return true;
  }
  return false;
}

// ---- stream identity ----------------------------------------------------------------------

StreamIdentity DeviceDriver::identify(CUstream s) {
  StreamIdentity out;
  const auto raw = reinterpret_cast<uintptr_t>(s);
  const bool special = raw == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
  out.kind = !special                     ? StreamIdentity::created
             : s == CU_STREAM_PER_THREAD ? StreamIdentity::per_thread
                                         : StreamIdentity::legacy;
  if (!has_ids_) {
    out.kind = StreamIdentity::unknown;
    return out;
  }
  unsigned long long v = 0;
  CUresult r = CUDA_SUCCESS;
  CUcontext cur = nullptr;
  if (special) {
    // NULL / CU_STREAM_PER_THREAD name a stream of the calling thread's current context. With
    // none current they mean this device's primary context's streams (the runtime API would
    // make it current), and must be asked about with it current: a real driver (580, H100)
    // crashes in cuStreamGetId(CU_STREAM_PER_THREAD) on a thread with no current context.
    ++out.queries;
    r = t_.ctx_get_current(&cur);
  }
  const bool push = r == CUDA_SUCCESS && special && cur == nullptr;
  if (push) {
    out.queries += 2;
    r = t_.ctx_push_current(ctx_);
    out.in_primary = r == CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) {
    // Capture first: cuStreamGetId of a capturing stream is refused (STREAM_CAPTURE_UNSUPPORTED)
    // and invalidates the capture, whatever the capture mode (measured: H100, driver 580, with
    // torch.cuda.graph); cuStreamIsCapturing is legal there.
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    ++out.queries;
    r = t_.stream_is_capturing(s, &st);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
      // The legacy stream while a blocking stream of its context captures: asking anything
      // more of it may invalidate that capture. Treated as capturing (no id, nothing reused).
      out.kind = StreamIdentity::capturing;
      r = CUDA_SUCCESS;
    } else if (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) {
      out.kind = StreamIdentity::capturing;
      if (t_.stream_get_capture_info != nullptr) {
        CUstreamCaptureStatus st2 = CU_STREAM_CAPTURE_STATUS_NONE;
        cuuint64_t capture_id = 0;
        ++out.queries;
        if (t_.stream_get_capture_info(s, &st2, &capture_id, nullptr, nullptr, nullptr,
                                       nullptr) == CUDA_SUCCESS &&
            st2 != CU_STREAM_CAPTURE_STATUS_NONE) {
          v = capture_id;
        }
      }
    } else if (r == CUDA_SUCCESS) {
      ++out.queries;
      r = t_.stream_get_id(s, &v);
    }
  }
  if (out.in_primary) {
    CUcontext popped = nullptr;
    t_.ctx_pop_current(&popped);
  }
  if (r != CUDA_SUCCESS) {
    throw driver::driver_error(
        "stream " + std::to_string(raw) + " is not a stream the driver knows (" +
            drv_.describe_error(EntryPoint::stream_get_id, r) + ")",
        r);
  }
  out.id = v;
  return out;
}

CUresult DeviceDriver::stream_ctx(CUstream s, CUcontext* ctx) {
  ++stream_queries_;
  return t_.stream_get_ctx(s, ctx);
}

bool DeviceDriver::surely_not_capturing(CUstream s) {
  ++stream_queries_;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return t_.stream_is_capturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE;
}

// ---- events -------------------------------------------------------------------------------

CUresult DeviceDriver::event_create(CUcontext ctx, CUevent* e) {
  ScopedContext scope(*this, ctx);
  if (!scope.ok()) return CUDA_ERROR_INVALID_CONTEXT;
  count(EntryPoint::event_create, 0);
  return t_.event_create(e, CU_EVENT_DISABLE_TIMING);
}

void DeviceDriver::event_destroy(CUcontext ctx, CUevent e) {
  ScopedContext scope(*this, ctx);
  count(EntryPoint::event_destroy, 0);
  t_.event_destroy(e);
}

CUresult DeviceDriver::event_record(CUcontext ctx, CUevent e, CUstream s) {
  ScopedContext scope(*this, ctx);
  if (!scope.ok()) return CUDA_ERROR_INVALID_CONTEXT;
  count(EntryPoint::event_record, 0);
  return t_.event_record(e, s);
}

CUresult DeviceDriver::event_query(CUevent e) {
  count(EntryPoint::event_query, 0);
  return t_.event_query(e);
}

CUresult DeviceDriver::event_synchronize(CUevent e) {
  count(EntryPoint::event_synchronize, 0);
  return t_.event_synchronize(e);
}

CUresult DeviceDriver::ctx_synchronize(CUcontext ctx) {
  ScopedContext scope(*this, ctx);
  if (!scope.ok()) return CUDA_ERROR_INVALID_CONTEXT;
  count(EntryPoint::ctx_synchronize, 0);
  return t_.ctx_synchronize();
}

}  // namespace expanse::core
