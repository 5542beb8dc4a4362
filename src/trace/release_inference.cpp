#include "trace/release_inference.hpp"

#include <algorithm>

namespace expanse::trace {

const char* release_kind_name(TraceRelease::Kind k) noexcept {
  switch (k) {
    case TraceRelease::Kind::empty_cache:
      return "empty_cache";
    case TraceRelease::Kind::free_and_retry:
      return "free_and_retry";
  }
  return "?";
}

namespace {

// A run of consecutive segment_free events, and what the allocator held before it.
struct Run {
  uint64_t frees = 0;
  uint64_t bytes = 0;
  int64_t reserved_before = 0;
  int64_t peak_before = 0;  // the highest reserved memory reached before the run
  uint64_t last_seq = 0;
  bool in_empty_cache = false;
  struct Freed {
    uint64_t size, stream;
  };
  std::vector<Freed> freed;
};

// Whether a wholly free segment of `seg_size` on `seg_stream` would have served a request of
// `rounded` bytes on `stream` from the cache (get_free_block): same stream and pool (small-pool
// segments are the only 2 MiB ones), large enough, and within the max_split_size rules.
bool could_serve(const TorchSettings& s, uint64_t seg_size, uint64_t seg_stream, uint64_t rounded,
                 uint64_t stream) {
  if (seg_stream != stream || seg_size < rounded) return false;
  if ((rounded <= kSmallSize) != (seg_size == kSmallBuffer)) return false;
  if (rounded < s.max_split_size && seg_size >= s.max_split_size) return false;
  if (rounded >= s.max_split_size && seg_size - rounded >= s.max_non_split_rounding) return false;
  return true;
}

// Whether the run's frees can be the free-and-retry of ops[op]'s allocation, followed by the
// segment_alloc `e`: that segment holds the allocation's block (it was made for it), and none of
// the released segments would have served the request from the cache before any release
// (PyTorch tries the cache first, and releases only after a cudaMalloc failed).
bool retry_of(const Trace& t, const Run& run, const TorchRecording::SegmentEvent& e, uint64_t op) {
  if (op < t.preexisting || op >= t.ops.size()) return false;
  const TraceOp& o = t.ops[op];
  if (o.type != TraceOp::Type::alloc || o.block >= t.torch->block_addr.size()) return false;
  const uint64_t a = t.torch->block_addr[o.block];
  if (a < e.addr || a - e.addr >= e.size) return false;
  const TorchSettings s = t.torch->settings.value_or(TorchSettings{});
  const uint64_t rounded = torch_round_size(s, o.size);
  for (const Run::Freed& f : run.freed) {
    if (could_serve(s, f.size, f.stream, rounded, t.streams[o.stream])) return false;
  }
  return true;
}

}  // namespace

void infer_releases(Trace& t) {
  t.releases.clear();
  if (!t.torch) return;
  const TorchRecording& rec = *t.torch;
  for (const auto& e : rec.events) {
    if (e.action == "segment_map" || e.action == "segment_unmap") return;
  }

  // Reserved memory when recording began: the end state less the recorded net change. The reader
  // checked that the end sum, every partial sum of the changes and every reserved value along
  // the way fit in 63 bits, so these sums are taken in that order.
  int64_t end = 0, net = 0;
  for (const auto& s : rec.end_segments) end += static_cast<int64_t>(s.size);
  for (const auto& e : rec.events) {
    if (e.action == "segment_alloc") net += static_cast<int64_t>(e.size);
    if (e.action == "segment_free") net -= static_cast<int64_t>(e.size);
  }
  int64_t reserved = end - net;
  int64_t peak = reserved;

  size_t next_oom = 0;
  Run run;
  uint64_t run_op = 0;
  auto close_run = [&](TraceRelease::Kind kind, const TorchRecording::Oom* oom) {
    if (run.frees == 0) return;
    t.releases.push_back({kind, run_op, oom != nullptr, oom != nullptr ? oom->size : 0,
                          oom != nullptr ? oom->stream : 0, run.frees, run.bytes});
    run = Run{};
  };
  // A run that nothing serves: the retry of an allocation that then failed, when the
  // recording's next record after it is an oom; else an empty_cache() call.
  auto close_unserved = [&]() {
    if (run.frees == 0) return;
    while (next_oom < rec.ooms.size() && rec.ooms[next_oom].seq < run.last_seq) ++next_oom;
    const bool oom_next = next_oom < rec.ooms.size() && rec.ooms[next_oom].op == run_op &&
                          !run.in_empty_cache;
    close_run(oom_next ? TraceRelease::Kind::free_and_retry : TraceRelease::Kind::empty_cache,
              oom_next ? &rec.ooms[next_oom] : nullptr);
  };

  for (size_t i = 0; i < rec.events.size(); ++i) {
    const auto& e = rec.events[i];
    if (run.frees != 0 && e.op != run_op) close_unserved();
    if (e.action == "segment_free") {
      if (run.frees == 0) {
        run_op = e.op;
        run.reserved_before = reserved;
        run.peak_before = peak;
      }
      ++run.frees;
      run.bytes += e.size;
      run.last_seq = e.seq;
      run.in_empty_cache = run.in_empty_cache || e.in_empty_cache;
      run.freed.push_back({e.size, e.stream});
      reserved -= static_cast<int64_t>(e.size);
    } else if (e.action == "segment_alloc") {
      if (run.frees != 0) {
        // An oom record between the frees and this segment_alloc ends the run first.
        while (next_oom < rec.ooms.size() && rec.ooms[next_oom].seq < run.last_seq) ++next_oom;
        if (next_oom < rec.ooms.size() && rec.ooms[next_oom].seq < e.seq) {
          close_unserved();
        } else {
          // The first cudaMalloc asked for e.size on top of reserved_before. (peak >= reserved
          // always, so the difference does not overflow where a sum might.)
          const bool past_peak =
              e.size > static_cast<uint64_t>(run.peak_before - run.reserved_before);
          const bool retry = past_peak && !run.in_empty_cache && retry_of(t, run, e, e.op);
          close_run(retry ? TraceRelease::Kind::free_and_retry : TraceRelease::Kind::empty_cache,
                    nullptr);
        }
      }
      reserved += static_cast<int64_t>(e.size);
      peak = std::max(peak, reserved);
    }
  }
  close_unserved();
}

}  // namespace expanse::trace
