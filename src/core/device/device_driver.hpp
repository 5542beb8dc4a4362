// The driver as one device's allocator sees it: VMM calls made in that device's primary context,
// stream and event calls made in the stream's own context, every call counted per entry point and
// priced by the cost model (stats.driver_calls and modeled_driver_ns). VMM failures throw
// driver::driver_error naming the entry point; stream and event calls return the CUresult, and
// the caller decides (stream_order.hpp: any failure means "not proven done", never "done").
#pragma once

#include "core/base/device_stats.hpp"
#include "driver_api/cost_model.hpp"
#include "driver/driver.hpp"

#include <cstddef>
#include <vector>

namespace expanse::core {

// What one allocate/free call means by its stream argument, as the driver says (identify()).
struct StreamIdentity {
  enum Kind : uint8_t {
    created,     // a stream the application created: the id names it for its whole life
    legacy,      // NULL or CU_STREAM_LEGACY in the calling thread's current context
    per_thread,  // CU_STREAM_PER_THREAD: the calling thread's stream of its current context
    unknown,     // the driver cannot give stream ids (older than CUDA 12.0)
    capturing,   // capturing now: cuStreamGetId would invalidate the capture, so no id
  };
  Kind kind = unknown;
  uint64_t id = 0;  // cuStreamGetId; 0 for unknown; for capturing, the capture's id (0: none)
  // The primary context was pushed to resolve NULL / CU_STREAM_PER_THREAD: no context was current.
  bool in_primary = false;
  uint8_t queries = 0;  // driver calls made to find out (the caller counts them under its lock)
};

class DeviceDriver {
 public:
  // rdma: ask cuMemCreate for GPUDirect RDMA capability where the device supports it with VMM.
  DeviceDriver(const driver::LoadedDriver& drv, int device, bool rdma = true);
  ~DeviceDriver();
  DeviceDriver(const DeviceDriver&) = delete;
  DeviceDriver& operator=(const DeviceDriver&) = delete;

  int device() const noexcept { return device_; }
  CUdevice cu_device() const noexcept { return dev_; }
  CUcontext primary() const noexcept { return ctx_; }
  size_t granularity() const noexcept { return granularity_; }
  size_t total_memory() const noexcept { return total_memory_; }
  const driver::LoadedDriver& loaded() const noexcept { return drv_; }
  // What cuMemCreate asks for beyond pinned device memory.
  bool posix_fd_handles() const noexcept { return prop_.requestedHandleTypes != 0; }
  // Whether cuMemCreate asks for GPUDirect RDMA (rdma requested, the device says it supports it
  // with VMM, and memory so created can be given access: see rdma_mapping_works).
  bool rdma_capable() const noexcept { return prop_.allocFlags.gpuDirectRDMACapable != 0; }

  // Makes ctx (default: the device's primary context) current for the scope; restores the
  // caller's after. ok() is false when the push failed (a destroyed context, say).
  class ScopedContext {
   public:
    explicit ScopedContext(DeviceDriver& d) : ScopedContext(d, d.ctx_) {}
    ScopedContext(DeviceDriver& d, CUcontext ctx);
    ~ScopedContext();
    ScopedContext(const ScopedContext&) = delete;
    ScopedContext& operator=(const ScopedContext&) = delete;
    bool ok() const noexcept { return ok_; }

   private:
    DeviceDriver& d_;
    bool pushed_ = false;
    bool ok_ = true;
  };

  // Switches the calling thread to relaxed stream-capture mode for the scope, so that expanse's
  // own driver calls (VMM, event queries) made while the application captures a graph are not
  // "potentially unsafe" calls that invalidate its capture (PyTorch's allocator does the same).
  class RelaxedCapture {
   public:
    explicit RelaxedCapture(DeviceDriver& d);
    ~RelaxedCapture();
    RelaxedCapture(const RelaxedCapture&) = delete;
    RelaxedCapture& operator=(const RelaxedCapture&) = delete;

   private:
    DeviceDriver& d_;
    CUstreamCaptureMode old_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool switched_ = false;
  };

  // VMM. size is in bytes; `pages` = size / granularity for the cost model. Each call runs in
  // relaxed capture mode (RelaxedCapture): allocating during an application's capture is legal.
  CUdeviceptr reserve(size_t size, size_t alignment);
  void address_free(CUdeviceptr va, size_t size);
  // Returns CUDA_ERROR_OUT_OF_MEMORY instead of throwing it (an expected outcome); throws others.
  CUresult create(size_t size, CUmemGenericAllocationHandle* out);
  // What cuMemGetInfo says is free on this device now (every process's memory counted).
  size_t free_memory();
  // size: the handle's bytes (for the cost model and the held bytes).
  void release(CUmemGenericAllocationHandle h, size_t size);
  // Releases a handle import_fd made: another process's memory, in no held count.
  void release_imported(CUmemGenericAllocationHandle h, size_t size);
  // The physical memory this device's own handles hold (created, not yet released), counted at
  // the driver calls themselves, and the least it held since reset_low_water(): what a
  // reservation's promise is checked against (it never dips, inside a call or between calls).
  size_t held_bytes() const noexcept { return held_; }
  size_t low_water_bytes() const noexcept { return low_water_; }
  void reset_low_water() noexcept { low_water_ = held_; }
  void map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
  // mappings: how many handles [va, va+size) covers (for the cost model).
  void unmap(CUdeviceptr va, size_t size, size_t mappings);
  // Grants READWRITE on [va, va+size) to this device and every peer enabled so far.
  void set_access(CUdeviceptr va, size_t size, size_t mappings);

  // Sharing (device_sharing.cpp): the driver's codes, never a throw. export_fd: a new POSIX fd
  // for handle h (cuMemExportToShareableHandle; the caller closes it). import_fd: a new handle
  // over the memory an exported fd names (cuMemImportFromShareableHandle; fd stays the
  // caller's). handle_device: the device ordinal whose memory h is.
  CUresult export_fd(CUmemGenericAllocationHandle h, int* fd);
  CUresult import_fd(int fd, CUmemGenericAllocationHandle* h);
  CUresult handle_device(CUmemGenericAllocationHandle h, int* device);

  // Host staging and copies, for putting a pool to sleep and waking it (device_copies.cpp). Each
  // runs in the device's primary context; failures throw driver::driver_error.
  void* host_alloc(size_t bytes);  // pinned host memory
  void free_host(void* p) noexcept;  // errors swallowed: the memory is gone either way
  CUstream create_copy_stream();  // a non-blocking stream of the primary context
  void destroy_stream(CUstream s) noexcept;
  void copy_to_host(void* dst, CUdeviceptr src, size_t bytes, CUstream s);
  void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes, CUstream s);
  void zero(CUdeviceptr dst, size_t bytes, CUstream s);
  void stream_synchronize(CUstream s);

  // Peer access. Whether device `peer` (an ordinal) may be given access to this device's memory
  // (cuDeviceCanAccessPeer); adds it to the devices set_access() grants. False when it may not.
  bool can_access_peer(int peer);
  void add_peer(int peer);
  bool has_peer(int peer) const;
  std::vector<int> peers() const { return peers_; }
  // The primary contexts of the peers added so far (work there may use this device's memory, so
  // an unmap of memory that outlives the page books waits for them too). Each is retained at the
  // first ask (not at add_peer: allocators that never need them make no extra calls) and
  // released at destruction. Throws driver_error when a retain fails.
  const std::vector<CUcontext>& peer_contexts();

  // Stream identity (cheap read-only queries, counted apart as stream_queries, not driver_calls).
  // identify(): one cuStreamGetId (more when no context is current and s is NULL or
  // CU_STREAM_PER_THREAD). Safe without the owner's lock: it touches no counter. Throws
  // driver_error when the driver rejects s.
  StreamIdentity identify(CUstream s);
  bool has_stream_ids() const noexcept { return has_ids_; }
  CUresult stream_ctx(CUstream s, CUcontext* ctx);
  // True only when the driver says s is not capturing (cuStreamIsCapturing is legal during
  // capture); false when it captures, its capture was invalidated, or the query failed.
  bool surely_not_capturing(CUstream s);
  // The calling thread's current context (nullptr: none).
  CUresult current_ctx(CUcontext* ctx) { return t_.ctx_get_current(ctx); }

  // Events live in a context; e must be recorded on a stream of the same context. Each call
  // makes ctx current around it. Return codes are the driver's.
  CUresult event_create(CUcontext ctx, CUevent* e);
  void event_destroy(CUcontext ctx, CUevent e);
  CUresult event_record(CUcontext ctx, CUevent e, CUstream s);
  CUresult event_query(CUevent e);  // CUDA_SUCCESS when complete
  CUresult event_synchronize(CUevent e);
  CUresult ctx_synchronize(CUcontext ctx);

  // Accounting, read under the owner's lock.
  const std::array<uint64_t, driver::kEntryPointCount>& calls() const noexcept { return calls_; }
  double modeled_ns() const noexcept { return modeled_ns_; }
  uint64_t stream_queries() const noexcept { return stream_queries_; }
  void add_stream_queries(uint64_t n) noexcept { stream_queries_ += n; }

 private:
  bool rdma_mapping_works();
  // mappings: how many handles a range call (unmap, set_access) covers.
  void count(driver::EntryPoint e, size_t bytes, size_t mappings = 1, size_t times = 1);
  void check(CUresult r, driver::EntryPoint e) const { drv_.check(r, e); }

  const driver::LoadedDriver& drv_;
  const driver::DriverTable& t_;
  int device_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  size_t granularity_ = 0;
  size_t total_memory_ = 0;
  bool has_ids_ = false;
  CUmemAllocationProp prop_{};
  std::vector<CUmemAccessDesc> access_;  // this device first, then the peers
  std::vector<int> peers_;
  std::vector<CUdevice> peer_devs_;    // retained primary contexts of the peers, released at
  std::vector<CUcontext> peer_ctxs_;   // destruction
  std::array<uint64_t, driver::kEntryPointCount> calls_{};
  double modeled_ns_ = 0;
  uint64_t stream_queries_ = 0;
  size_t held_ = 0;
  size_t low_water_ = 0;
};

}  // namespace expanse::core
