#include "replay/replay.hpp"

#include "replay/device_streams.hpp"

#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "conf/env_config.hpp"
#include "replay/host_model.hpp"
#include "expanse/errors.hpp"
#include "sim/sim.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <cmath>
#include <memory>
#include <vector>

namespace expanse::replay {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The releases inferred from the recording up to ops[op]. An empty_cache() call is the
// program's: expanse gives back its cached pages as it does for torch.cuda.empty_cache().
// A free-and-retry is PyTorch's own answer to a cudaMalloc the real device refused, not a
// request of the program: expanse makes no release there. Under the same pressure, on its own
// device, expanse reclaims cached pages itself before it fails an allocation; copying PyTorch's
// policy into it would credit expanse with releases it never chose.
void release_before(const trace::Trace& t, uint64_t op, size_t& next,
                    core::DeviceAllocator& alloc) {
  for (; next < t.releases.size() && t.releases[next].op <= op; ++next) {
    if (t.releases[next].kind == trace::TraceRelease::Kind::empty_cache) alloc.release_cached();
  }
}

bool conf_sets(const conf::Config& conf, const std::string& key) {
  for (const auto& kv : conf::parse_pairs(conf.text)) {
    if (kv.first == key) return true;
  }
  return false;
}

// The second host thread of the host model (PyTorch's autograd engine thread): runs what it is
// handed while the main thread waits, so operations keep the trace's order. Each thread has the
// device's primary context current, as PyTorch's threads do after cudaSetDevice.
class HostThreads {
 public:
  explicit HostThreads(const DeviceStreams& streams) : streams_(streams), main_(streams) {}
  ~HostThreads() { stop(); }
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;

  // Runs job on the autograd thread (started on first use) and waits for it; rethrows what it
  // threw.
  void run_on_autograd(const std::function<void()>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
    job_ = &job;
    cv_.notify_all();
    cv_.wait(lock, [&] { return job_ == nullptr; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  // Ends the autograd thread (its thread cache goes back to the allocator as it exits).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!worker_.joinable()) return;
      quit_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

 private:
  void loop() {
    DeviceStreams::Current current(streams_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return job_ != nullptr || quit_; });
      if (job_ == nullptr) return;
      try {
        (*job_)();
      } catch (...) {
        error_ = std::current_exception();
      }
      job_ = nullptr;
      cv_.notify_all();
    }
  }

  const DeviceStreams& streams_;
  DeviceStreams::Current main_;  // the main thread's context, for the replay's life
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool quit_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace

size_t replay_granularity(const conf::Config& conf) {
  return sim::sim_config_from_string(conf.text).granularity;
}

ReplayResult replay_trace(const trace::Trace& t, const conf::Config& conf, size_t capacity,
                          const ReplayOptions& o) {
  const HostModel& host = o.host;
  const bool stop_at_first_oom = o.stop_at_first_oom;
  const ReplayProgress& progress = o.progress;
  const bool record_mapped = o.record_mapped;
  int passes = o.passes;
  const auto t0 = Clock::now();
  if (capacity > kMaxReplayCapacity) {
    throw usage_error("replay: a device of " + conf::format_size(capacity) +
                      " is more than replay models (at most " +
                      conf::format_size(kMaxReplayCapacity) + ")");
  }
  sim::SimConfig cfg = sim::sim_config_from_string(conf.text);
  cfg.devices = 1;
  cfg.capacity = capacity;
  cfg.backing = false;  // replay never touches the memory
  if (!conf_sets(conf, "sim_gpu_lag")) cfg.gpu_lag = host.gpu_lag;
  auto drv = driver::load_sim(cfg, "replay");

  ReplayResult r;
  r.capacity = capacity;
  r.host = host;
  r.host.gpu_lag = cfg.gpu_lag;
  passes = std::max(passes, 1);
  const uint64_t total = t.ops.size() * static_cast<uint64_t>(passes);
  const std::vector<uint8_t> thread_of =
      !host.autograd_thread          ? std::vector<uint8_t>(t.ops.size(), 0)
      : t.threads.size() == t.ops.size() ? t.threads
                                         : autograd_threads(t);
  {
    DeviceStreams streams(*drv, 0, t.streams);
    conf::AllocatorOptions opts = conf::options_for_device(conf, capacity);
    if (!host.thread_caches) opts.thread_cache_bytes = 0;
    core::DeviceAllocator alloc(*drv, 0, opts);
    r.page_size = alloc.page_size();
    // The trace's legacy default stream as the host passes it: PyTorch passes NULL.
    auto stream_for = [&](uint32_t s) {
      CUstream h = streams[s];
      return h == nullptr && !host.null_stream ? CU_STREAM_LEGACY : h;
    };
    std::vector<void*> ptr(t.blocks, nullptr);
    std::vector<uint32_t> stream_of(passes > 1 ? t.blocks : 0, 0);  // each block's alloc stream
    core::DeviceStats peaks;  // the highest of each pass's peaks
    bool stopped = false;
    HostThreads threads(streams);  // the autograd thread, when the model has one
    size_t next_mark = 0;
    for (int pass = 1; pass <= passes && !stopped; ++pass) {
      const core::DeviceStats before = alloc.stats();
      PassResult pr;
      size_t next_release = 0;
      // Operation i, on whichever thread makes it; false: stop here (the first OOM).
      auto run_op = [&](uint64_t i) {
        const trace::TraceOp& op = t.ops[i];
        if (op.type == trace::TraceOp::Type::alloc) {
          std::string failure;
          try {
            ptr[op.block] = alloc.allocate(op.size, stream_for(op.stream));
            if (passes > 1) stream_of[op.block] = op.stream;
          } catch (const out_of_memory& e) {
            failure = e.what();
          } catch (const usage_error& e) {  // a size no device can hold: an OOM too
            failure = e.what();
          }
          if (!failure.empty()) {
            ++pr.ooms;
            if (r.ooms++ == 0) {
              r.first_oom_op = i;
              r.first_oom_pass = pass;
              r.first_oom = failure;
            }
            if (stop_at_first_oom) return false;
          }
        } else if (ptr[op.block] != nullptr) {
          alloc.deallocate(ptr[op.block], stream_for(op.stream));
          ptr[op.block] = nullptr;
        }
        return true;
      };
      for (uint64_t i = 0; i < t.ops.size() && !stopped;) {
        // Releases happen between operations, on the main thread.
        release_before(t, i, next_release, alloc);
        // A run of operations of one thread (a release ends it: the main thread makes those).
        uint64_t end = i + 1;
        while (end < t.ops.size() && thread_of[end] == thread_of[i] &&
               (next_release >= t.releases.size() || t.releases[next_release].op > end)) {
          ++end;
        }
        const uint64_t done_before = i;
        auto run_span = [&] {
          for (; i < end; ++i) {
            if (!run_op(i)) {
              stopped = true;
              return;
            }
            // The GPU moves on as the host issues work (sim_gpu_lag).
            sim::advance_host_clock(1);
            ++r.ops_done;
            if (record_mapped && pass == 1) {
              r.mapped_after_op.push_back(alloc.stats().mapped_bytes);
            }
            if (pass == 1 && next_mark < o.marks.size() && o.marks[next_mark] == i) {
              const core::DeviceStats now = alloc.stats();
              r.marks.push_back({i, now.total_driver_calls(), now.modeled_driver_ns * 1e-9,
                                 now.physical_bytes, now.peak_physical_bytes, now.driver_calls,
                                 now.num_created_pages});
              ++next_mark;
            }
            if (progress && (r.ops_done & 4095) == 0) progress(r.ops_done, total);
          }
        };
        if (thread_of[done_before] == 0) {
          run_span();
        } else {
          threads.run_on_autograd(run_span);
        }
      }
      if (!stopped) release_before(t, t.ops.size(), next_release, alloc);
      if (pass < passes && !stopped) {
        // What the pass left live goes before the next one starts from nothing live.
        for (uint32_t b = 0; b < t.blocks; ++b) {
          if (ptr[b] == nullptr) continue;
          alloc.deallocate(ptr[b], stream_for(stream_of[b]));
          ptr[b] = nullptr;
        }
      }
      const core::DeviceStats after = alloc.stats();
      pr.driver_calls_total = after.total_driver_calls() - before.total_driver_calls();
      pr.modeled_driver_seconds = (after.modeled_driver_ns - before.modeled_driver_ns) * 1e-9;
      pr.peak_physical_bytes = after.peak_physical_bytes;
      pr.peak_mapped_bytes = after.peak_mapped_bytes;
      pr.created_pages = after.num_created_pages - before.num_created_pages;
      for (size_t e = 0; e < pr.driver_calls.size(); ++e) {
        pr.driver_calls[e] = after.driver_calls[e] - before.driver_calls[e];
      }
      r.passes.push_back(pr);
      peaks.peak_requested_bytes = std::max(peaks.peak_requested_bytes, after.peak_requested_bytes);
      peaks.peak_allocated_bytes = std::max(peaks.peak_allocated_bytes, after.peak_allocated_bytes);
      peaks.peak_mapped_bytes = std::max(peaks.peak_mapped_bytes, after.peak_mapped_bytes);
      peaks.peak_physical_bytes = std::max(peaks.peak_physical_bytes, after.peak_physical_bytes);
      peaks.peak_va_reserved_bytes =
          std::max(peaks.peak_va_reserved_bytes, after.peak_va_reserved_bytes);
      if (pass < passes) alloc.reset_peaks();  // the next pass's peaks are its own
    }
    threads.stop();  // its thread cache goes back to the allocator before the stats
    r.stats = alloc.stats();
    r.stats.peak_requested_bytes = peaks.peak_requested_bytes;
    r.stats.peak_allocated_bytes = peaks.peak_allocated_bytes;
    r.stats.peak_mapped_bytes = peaks.peak_mapped_bytes;
    r.stats.peak_physical_bytes = peaks.peak_physical_bytes;
    r.stats.peak_va_reserved_bytes = peaks.peak_va_reserved_bytes;
    // Destroying the allocator gives every page and reservation back; the streams go after it.
  }
  if (progress) progress(total, total);
  r.wall_seconds = seconds_since(t0);
  return r;
}

MinCapacity find_min_capacity(const trace::Trace& t, const conf::Config& conf, size_t start,
                              const SearchProgress& progress, const HostModel& host) {
  const auto t0 = Clock::now();
  const size_t g = replay_granularity(conf);
  MinCapacity out;

  auto probe = [&](size_t units, int expected) {
    ++out.probes;
    ReplayProgress p;
    if (progress) {
      p = [&, expected](uint64_t done, uint64_t total) {
        progress(out.probes, std::max(expected, out.probes), done, total);
      };
    }
    ReplayOptions ro;
    ro.stop_at_first_oom = true;
    ro.progress = p;
    ro.host = host;
    return replay_trace(t, conf, units * g, ro);
  };
  auto expected_probes = [](size_t lo, size_t hi) {
    int n = 0;
    while (hi - lo > 1) {
      lo += (hi - lo) / 2;
      ++n;
    }
    return n;
  };

  // lo: known too small (cannot hold the peak of live bytes); hi: known to replay.
  const size_t max_units = kMaxReplayCapacity / g;
  size_t lo = static_cast<size_t>(t.peak_live_bytes / g + (t.peak_live_bytes % g != 0));
  if (lo > max_units) {
    throw trace::input_error(t.path + ": the trace's peak of live bytes, " +
                      conf::format_size(t.peak_live_bytes) + ", is more than the largest device " +
                      "replay models (" + conf::format_size(kMaxReplayCapacity) + ")");
  }
  lo = lo == 0 ? 0 : lo - 1;
  size_t hi = std::min(std::max<size_t>(start / g, lo + 1), max_units);
  ReplayResult at_hi = probe(hi, 1 + expected_probes(lo, hi));
  const size_t cap_units = hi > max_units / 64 ? max_units : hi * 64;
  while (at_hi.ooms != 0) {
    lo = hi;
    if (hi >= cap_units) {
      throw trace::input_error(t.path + ": the trace does not replay with no OOM even on " +
                        conf::format_size(hi * g) + " (" + at_hi.first_oom + ")");
    }
    hi = std::min(hi * 2, cap_units);
    at_hi = probe(hi, out.probes + 1 + expected_probes(lo, hi));
  }
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    ReplayResult r = probe(mid, out.probes + expected_probes(lo, hi));
    if (r.ooms == 0) {
      hi = mid;
      at_hi = std::move(r);
    } else {
      lo = mid;
    }
  }
  out.bytes = hi * g;
  out.at_min = std::move(at_hi);
  out.wall_seconds = seconds_since(t0);
  return out;
}

}  // namespace expanse::replay
