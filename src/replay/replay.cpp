#include "replay/replay.hpp"

#include "replay/device_streams.hpp"

#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "driver/env_config.hpp"
#include "expanse/errors.hpp"
#include "sim/sim.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

namespace expanse::replay {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

size_t replay_granularity(const api::Config& conf) {
  return sim::sim_config_from_string(conf.text).granularity;
}

ReplayResult replay_trace(const Trace& t, const api::Config& conf, size_t capacity,
                          bool stop_at_first_oom, const ReplayProgress& progress,
                          bool record_mapped) {
  const auto t0 = Clock::now();
  sim::SimConfig cfg = sim::sim_config_from_string(conf.text);
  cfg.devices = 1;
  cfg.capacity = capacity;
  cfg.backing = false;  // replay never touches the memory
  auto drv = driver::load_sim(cfg, "replay");

  ReplayResult r;
  r.capacity = capacity;
  {
    DeviceStreams streams(*drv, 0, t.streams);
    core::DeviceAllocator alloc(*drv, 0, api::options_for_device(conf, capacity));
    r.page_size = alloc.page_size();
    std::vector<void*> ptr(t.blocks, nullptr);
    const uint64_t total = t.ops.size();
    for (uint64_t i = 0; i < total; ++i) {
      const TraceOp& op = t.ops[i];
      if (op.type == TraceOp::Type::alloc) {
        std::string failure;
        try {
          ptr[op.block] = alloc.allocate(op.size, streams[op.stream]);
        } catch (const out_of_memory& e) {
          failure = e.what();
        } catch (const usage_error& e) {  // a size no device can hold: an OOM too
          failure = e.what();
        }
        if (!failure.empty()) {
          if (r.ooms++ == 0) {
            r.first_oom_op = i;
            r.first_oom = failure;
          }
          if (stop_at_first_oom) {
            r.ops_done = i;
            break;
          }
        }
      } else if (ptr[op.block] != nullptr) {
        alloc.deallocate(ptr[op.block], streams[op.stream]);
        ptr[op.block] = nullptr;
      }
      r.ops_done = i + 1;
      if (record_mapped) r.mapped_after_op.push_back(alloc.stats().mapped_bytes);
      if (progress && (i & 4095) == 0) progress(i, total);
    }
    r.stats = alloc.stats();
    // Destroying the allocator gives every page and reservation back; the streams go after it.
  }
  if (progress) progress(t.ops.size(), t.ops.size());
  r.wall_seconds = seconds_since(t0);
  return r;
}

MinCapacity find_min_capacity(const Trace& t, const api::Config& conf, size_t start,
                              const SearchProgress& progress) {
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
    return replay_trace(t, conf, units * g, true, p);
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
  size_t lo = static_cast<size_t>((t.peak_live_bytes + g - 1) / g);
  lo = lo == 0 ? 0 : lo - 1;
  size_t hi = std::max<size_t>(start / g, lo + 1);
  ReplayResult at_hi = probe(hi, 1 + expected_probes(lo, hi));
  const size_t cap_units = hi * 64;
  while (at_hi.ooms != 0) {
    lo = hi;
    if (hi >= cap_units) {
      throw input_error(t.path + ": the trace does not replay with no OOM even on " +
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
