// The C ABI: every entry point catches everything, records the message for expanse_last_error()
// and returns a code. Nothing escapes into C (or PyTorch).
// These are the definitions: expanse.h's mapping of NULL for per-thread-default-stream code
// must not rename them.
#define EXPANSE_NULL_STREAM_IS_LEGACY 1
#include "api/errors.hpp"
#include "api/history.hpp"
#include "api/pool_registry.hpp"
#include "api/runtime.hpp"
#include "api/c_stats.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/expanse.h"

#include <cstring>
#include <string>
#include <vector>

using expanse::api::Runtime;
using expanse::api::guarded;

// expanse_get_trace hands out TraceEntry::Action as EXPANSE_TRACE_*.
static_assert(static_cast<int>(expanse::api::TraceEntry::Action::alloc) == EXPANSE_TRACE_ALLOC &&
                  static_cast<int>(expanse::api::TraceEntry::Action::free_requested) ==
                      EXPANSE_TRACE_FREE_REQUESTED &&
                  static_cast<int>(expanse::api::TraceEntry::Action::free_completed) ==
                      EXPANSE_TRACE_FREE_COMPLETED &&
                  static_cast<int>(expanse::api::TraceEntry::Action::segment_map) ==
                      EXPANSE_TRACE_SEGMENT_MAP &&
                  static_cast<int>(expanse::api::TraceEntry::Action::segment_unmap) ==
                      EXPANSE_TRACE_SEGMENT_UNMAP &&
                  static_cast<int>(expanse::api::TraceEntry::Action::oom) == EXPANSE_TRACE_OOM,
              "EXPANSE_TRACE_* and TraceEntry::Action disagree");

namespace {

CUstream to_cu(struct CUstream_st* s) { return reinterpret_cast<CUstream>(s); }

// The context a capture on s would belong to (the calling thread's current one for the special
// handles, as the driver resolves them).
CUcontext capture_context(struct CUstream_st* s, const char* what) {
  const expanse::driver::LoadedDriver& d = Runtime::get().driver();
  CUcontext ctx = nullptr;
  const CUresult r = d.table().stream_get_ctx(to_cu(s), &ctx);
  if (r != CUDA_SUCCESS || ctx == nullptr) {
    throw expanse::driver_failure(
        std::string(what) + ": cannot tell the context of stream " +
            std::to_string(reinterpret_cast<uintptr_t>(s)) + " (" +
            d.describe_error(expanse::driver::EntryPoint::stream_get_ctx, r) +
            "); a NULL or per-thread stream needs a current context",
        static_cast<int>(r));
  }
  return ctx;
}

}  // namespace

extern "C" {

EXPANSE_C_API void* expanse_malloc(size_t size, int device, struct CUstream_st* stream) {
  void* out = nullptr;
  guarded([&] { out = expanse::api::routed_allocate(size, device, to_cu(stream)); });
  return out;
}

EXPANSE_C_API int expanse_malloc_checked(void** out, size_t size, int device,
                                         struct CUstream_st* stream) {
  if (out == nullptr) {
    expanse::api::last_error() = "expanse_malloc_checked: out must not be NULL";
    return EXPANSE_EINVAL;
  }
  *out = nullptr;
  return guarded([&] { *out = expanse::api::routed_allocate(size, device, to_cu(stream)); });
}

EXPANSE_C_API int expanse_free_checked(void* ptr, size_t size, int device,
                                       struct CUstream_st* stream) {
  if (ptr == nullptr) return EXPANSE_OK;
  return guarded([&] { expanse::api::free_on_device(ptr, size, device, to_cu(stream)); });
}

EXPANSE_C_API void expanse_free(void* ptr, size_t size, int device, struct CUstream_st* stream) {
  (void)expanse_free_checked(ptr, size, device, stream);
}

EXPANSE_C_API int expanse_record_stream(void* ptr, struct CUstream_st* stream) {
  return guarded([&] { expanse::api::owner_of(ptr, "record_stream").record_stream(ptr, to_cu(stream)); });
}

EXPANSE_C_API int expanse_release_cached(int device) {
  return guarded([&] {
    Runtime& rt = Runtime::get();
    // A device expanse never set up caches nothing; setting it up would retain its context.
    if (device >= 0 && device < rt.device_count() && rt.existing(device) == nullptr) return;
    rt.device(device).release_cached();
  });
}

EXPANSE_C_API int expanse_capture_begin(struct CUstream_st* stream) {
  return guarded([&] {
    expanse::core::CaptureAnnouncements::begin(capture_context(stream, "expanse_capture_begin"),
                                               stream);
  });
}

EXPANSE_C_API int expanse_capture_end(struct CUstream_st* stream) {
  return guarded([&] {
    // The context remembered at begin: no driver call, so an end after the stream was destroyed
    // (or while the runtime cannot be had) still ends the announcement.
    if (Runtime* rt = Runtime::current()) rt->capture_ended(to_cu(stream));
    if (expanse::core::CaptureAnnouncements::end_stream(stream)) return;
    expanse::core::CaptureAnnouncements::end(capture_context(stream, "expanse_capture_end"));
  });
}

EXPANSE_C_API int expanse_set_limit(int device, size_t bytes) {
  return guarded([&] { Runtime::get().device(device).set_limit(bytes); });
}

EXPANSE_C_API int expanse_reserve(int device, size_t bytes, size_t* reserved) {
  return guarded([&] {
    const size_t got = Runtime::get().device(device).reserve(bytes);
    if (reserved != nullptr) *reserved = got;
  });
}

EXPANSE_C_API int expanse_unreserve(int device) {
  return guarded([&] {
    Runtime& rt = Runtime::get();
    // A device expanse never set up reserves nothing; setting it up would retain its context.
    if (device >= 0 && device < rt.device_count() && rt.existing(device) == nullptr) return;
    rt.device(device).reserve(0);
  });
}

EXPANSE_C_API int expanse_get_stats(int device, expanse_stats* out) {
  return guarded([&] { expanse::api::fill_stats(device, out); });
}

EXPANSE_C_API int expanse_reset_peak_stats(int device) {
  return guarded([&] {
    Runtime& rt = Runtime::get();
    // A device expanse never set up has no peaks; setting it up would retain its context.
    if (device >= 0 && device < rt.device_count() && rt.existing(device) == nullptr) return;
    rt.device(device).reset_peaks();
  });
}

EXPANSE_C_API const char* expanse_entry_point_name(int i) {
  if (i < 0 || i >= expanse::driver::kEntryPointCount) return nullptr;
  return expanse::driver::entry_point_name(static_cast<expanse::driver::EntryPoint>(i));
}

EXPANSE_C_API const char* expanse_stats_field_name(int i) {
  return expanse::api::stats_field_name(i);
}

EXPANSE_C_API const char* expanse_stats_field_type(int i) {
  return expanse::api::stats_field_type(i);
}

EXPANSE_C_API const char* expanse_last_error(void) { return expanse::api::last_error().c_str(); }

EXPANSE_C_API int expanse_init(const char* conf) {
  return guarded([&] { Runtime::init(conf == nullptr ? std::string() : std::string(conf)); });
}

EXPANSE_C_API int expanse_shutdown(void) {
  return guarded([&] { Runtime::shutdown(); });
}

EXPANSE_C_API const char* expanse_driver_description(void) {
  const char* out = nullptr;
  guarded([&] { out = Runtime::get().driver().description().c_str(); });
  return out;
}

EXPANSE_C_API int expanse_device_count(void) {
  int n = -1;
  guarded([&] { n = Runtime::get().device_count(); });
  return n;
}

EXPANSE_C_API int expanse_record_history(int enabled, size_t max_entries) {
  return guarded([&] { expanse::api::History::get().record(enabled != 0, max_entries); });
}

EXPANSE_C_API int expanse_dump_snapshot(const char* path) {
  return guarded([&] {
    if (path == nullptr) throw expanse::usage_error("expanse_dump_snapshot: path is NULL");
    expanse::api::dump_snapshot(path);
  });
}

EXPANSE_C_API int expanse_get_segments(int device, expanse_segment_info* segments,
                                       size_t* num_segments, expanse_block_info* blocks,
                                       size_t* num_blocks) {
  return guarded([&] {
    if (num_segments == nullptr || num_blocks == nullptr) {
      throw expanse::usage_error("expanse_get_segments: num_segments and num_blocks must not be NULL");
    }
    if ((segments == nullptr && *num_segments != 0) || (blocks == nullptr && *num_blocks != 0)) {
      throw expanse::usage_error("expanse_get_segments: a NULL array needs a capacity of 0");
    }
    Runtime& rt = Runtime::get();
    if (device < 0 || device >= rt.device_count()) {
      throw expanse::usage_error("expanse_get_segments: device " + std::to_string(device) +
                                 " does not exist (" + std::to_string(rt.device_count()) +
                                 " devices)");
    }
    const expanse::core::DeviceAllocator* a = rt.existing(device);
    const auto segs = a == nullptr ? std::vector<expanse::core::SegmentView>{} : a->segments();
    size_t nb = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      const auto& sv = segs[i];
      if (i < *num_segments) {
        segments[i] = expanse_segment_info{sv.address, sv.size, nb, sv.blocks.size(),
                                           sv.small_arena ? 1u : 0u, 0};
      }
      for (const auto& b : sv.blocks) {
        if (nb < *num_blocks) {
          const uint32_t state =
              b.state == expanse::core::BlockView::State::live            ? EXPANSE_BLOCK_LIVE
              : b.state == expanse::core::BlockView::State::awaiting_free ? EXPANSE_BLOCK_AWAITING_FREE
                                                                          : EXPANSE_BLOCK_FREE;
          blocks[nb] = expanse_block_info{b.address, b.size, b.requested, state, 0};
        }
        ++nb;
      }
    }
    *num_segments = segs.size();
    *num_blocks = nb;
  });
}

EXPANSE_C_API int expanse_get_trace(int device, expanse_trace_entry* entries, size_t* num_entries) {
  return guarded([&] {
    if (num_entries == nullptr) {
      throw expanse::usage_error("expanse_get_trace: num_entries must not be NULL");
    }
    if (entries == nullptr && *num_entries != 0) {
      throw expanse::usage_error("expanse_get_trace: a NULL array needs a capacity of 0");
    }
    const auto trace = expanse::api::History::get().trace(device);
    for (size_t i = 0; i < trace.size() && i < *num_entries; ++i) {
      const auto& e = trace[i];
      // TraceEntry::Action lists the actions in the order of EXPANSE_TRACE_*.
      entries[i] = expanse_trace_entry{static_cast<uint32_t>(e.action), 0, e.addr, e.size,
                                       e.stream, e.time_us};
    }
    *num_entries = trace.size();
  });
}

EXPANSE_C_API int expanse_enable_peer_access(int device, int peer) {
  return guarded([&] {
    Runtime& rt = Runtime::get();
    if (peer < 0 || peer >= rt.device_count()) {
      throw expanse::usage_error("expanse_enable_peer_access: peer device " +
                                 std::to_string(peer) + " does not exist (" +
                                 std::to_string(rt.device_count()) + " devices)");
    }
    rt.device(device).enable_peer_access(peer);
  });
}

}  // extern "C"
