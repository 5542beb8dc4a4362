// The per-thread-default-stream (_ptsz) variants of the stream entry points: code built with
// --default-stream per-thread (CUDA_API_PER_THREAD_DEFAULT_STREAM) calls these, and for them the
// NULL stream is the calling thread's per-thread stream, not the legacy one (CU_STREAM_LEGACY
// still names the legacy stream). Counted under the base name's entry point.
#include "sim/sim_entry.hpp"

namespace expanse::sim {
namespace {

CUstream per_thread_if_null(CUstream h) noexcept { return h == nullptr ? CU_STREAM_PER_THREAD : h; }

}  // namespace

CUresult sim_stream_synchronize_ptsz(CUstream stream) {
  return sim_stream_synchronize(per_thread_if_null(stream));
}
CUresult sim_stream_query_ptsz(CUstream stream) {
  return sim_stream_query(per_thread_if_null(stream));
}
CUresult sim_stream_wait_event_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  return sim_stream_wait_event(per_thread_if_null(stream), event, flags);
}
CUresult sim_event_record_ptsz(CUevent event, CUstream stream) {
  return sim_event_record(event, per_thread_if_null(stream));
}
CUresult sim_stream_get_ctx_ptsz(CUstream stream, CUcontext* ctx) {
  return sim_stream_get_ctx(per_thread_if_null(stream), ctx);
}
CUresult sim_stream_get_ctx_v2_ptsz(CUstream stream, CUcontext* ctx, CUgreenCtx* green) {
  return sim_stream_get_ctx_v2(per_thread_if_null(stream), ctx, green);
}
CUresult sim_stream_get_id_ptsz(CUstream stream, unsigned long long* id) {
  return sim_stream_get_id(per_thread_if_null(stream), id);
}
CUresult sim_stream_get_flags_ptsz(CUstream stream, unsigned int* flags) {
  return sim_stream_get_flags(per_thread_if_null(stream), flags);
}
CUresult sim_stream_get_device_ptsz(CUstream stream, CUdevice* dev) {
  return sim_stream_get_device(per_thread_if_null(stream), dev);
}
CUresult sim_stream_begin_capture_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return sim_stream_begin_capture(per_thread_if_null(stream), mode);
}
CUresult sim_stream_begin_capture_v1_ptsz(CUstream stream) {
  return sim_stream_begin_capture_v1(per_thread_if_null(stream));
}
CUresult sim_stream_end_capture_ptsz(CUstream stream, CUgraph* graph) {
  return sim_stream_end_capture(per_thread_if_null(stream), graph);
}
CUresult sim_stream_is_capturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return sim_stream_is_capturing(per_thread_if_null(stream), status);
}
CUresult sim_stream_get_capture_info_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                          cuuint64_t* id, CUgraph* graph,
                                          const CUgraphNode** deps,
                                          const CUgraphEdgeData** edges, size_t* num_deps) {
  return sim_stream_get_capture_info(per_thread_if_null(stream), status, id, graph, deps, edges,
                                     num_deps);
}
CUresult sim_stream_get_capture_info_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id, CUgraph* graph,
                                             const CUgraphNode** deps, size_t* num_deps) {
  return sim_stream_get_capture_info_v2(per_thread_if_null(stream), status, id, graph, deps,
                                        num_deps);
}
CUresult sim_stream_get_capture_info_v1_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id) {
  return sim_stream_get_capture_info_v1(per_thread_if_null(stream), status, id);
}

CUresult sim_memcpy_htod_async_ptsz(CUdeviceptr dst, const void* src, size_t bytes,
                                    CUstream stream) {
  return sim_memcpy_htod_async(dst, src, bytes, per_thread_if_null(stream));
}
CUresult sim_memcpy_dtoh_async_ptsz(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return sim_memcpy_dtoh_async(dst, src, bytes, per_thread_if_null(stream));
}
CUresult sim_memset_d8_async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                  CUstream stream) {
  return sim_memset_d8_async(dst, value, n, per_thread_if_null(stream));
}

}  // namespace expanse::sim
