// Recorded allocation traces, read into one replayable form: a PyTorch memory snapshot pickle
// (torch.cuda.memory._snapshot() / _dump_snapshot()) or an RMM log CSV
// (Thread,Time,Action,Pointer,Size,Stream, as rmm::mr::logging_resource_adaptor writes it).
#pragma once

#include "trace/torch_recording.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace expanse::trace {

// Bad input. The message names the file and where in it: "f.csv:17: ..." (line),
// "f.pickle: byte 1234 (device_traces[0][56]): ..." (byte offset and record).
class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TraceOp {
  enum class Type : uint8_t { alloc, free };
  Type type = Type::alloc;
  uint32_t stream = 0;  // index into Trace::streams
  uint32_t block = 0;   // block id, 0 .. Trace::blocks - 1; each block is allocated once
  uint64_t size = 0;    // bytes (alloc only)
};

// A release of cached memory the recording shows but does not mark, inferred from its segment
// events (trace/release_inference.hpp). Replayers run it before Trace::ops[op].
struct TraceRelease {
  enum class Kind : uint8_t {
    empty_cache,     // torch.cuda.empty_cache(): every wholly free cached segment released
    free_and_retry,  // cudaMalloc failed during ops[op]'s allocation: the allocator released
                     // its cached segments and tried again
  };
  Kind kind = Kind::empty_cache;
  uint64_t op = 0;            // index into Trace::ops (ops.size(): after the last one)
  bool before_oom = false;    // free_and_retry whose allocation then failed (an oom record,
                              // not in ops): the release happens before ops[op]
  uint64_t oom_request = 0;   // before_oom: the failed request's bytes and stream id
  uint64_t oom_stream = 0;
  uint64_t segment_frees = 0; // recorded segment_free events it accounts for
  uint64_t bytes = 0;         // their sizes
};
const char* release_kind_name(TraceRelease::Kind k) noexcept;

struct Trace {
  std::string path;
  std::string format;  // "pytorch-snapshot" or "rmm-csv"
  int device = 0;      // snapshot: the device_traces entry replayed
  int devices_with_events = 0;
  uint64_t events = 0;       // records of the trace read (snapshot: events of that device;
                             // CSV: data rows)
  uint64_t allocs = 0;       // recorded allocations
  uint64_t frees = 0;        // recorded frees (free_completed / free rows)
  uint64_t preexisting = 0;  // blocks allocated before recording began (allocated first)
  uint64_t preexisting_bytes = 0;
  uint64_t failed_allocs = 0;  // RMM "allocate failure" rows (not replayed)
  uint64_t peak_live_bytes = 0;
  uint64_t live_at_end_bytes = 0;
  std::optional<uint64_t> torch_peak_reserved_bytes;  // snapshots: PyTorch's own segments
  std::vector<uint64_t> streams;  // the trace's stream ids (0 = the legacy default stream)
  std::vector<TraceOp> ops;       // preexisting allocations first, then the trace in order
  // Which host thread made each operation (0, 1, ...), where the source says (a generated
  // workload); empty where it does not (replays then model it: replay/host_model.hpp).
  std::vector<uint8_t> threads;
  std::vector<TraceRelease> releases;  // inferred from a snapshot's segment events, by op
  uint32_t blocks = 0;
  // Snapshots: what PyTorch's caching allocator itself did (segments, their events, settings).
  std::optional<TorchRecording> torch;
};

// Reads a trace file, choosing the format from its content. device: the snapshot device to
// replay (-1: the one with the most allocations). Throws input_error.
Trace load_trace(const std::string& path, int device = -1);

// The same from bytes already read (path is only used in messages).
Trace load_snapshot(const std::string& path, std::string_view data, int device = -1);
Trace load_rmm_csv(const std::string& path, std::string_view data);

}  // namespace expanse::trace
