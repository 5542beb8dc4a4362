#include "replay/host_model.hpp"

#include "expanse/errors.hpp"

#include <algorithm>
#include <cstdlib>

namespace expanse::replay {
namespace {

// Calibrated once against a real run (docs/performance.md, "The host model"): the GPU reaches a
// fence this many trace operations after the host issued it.
constexpr uint64_t kCalibratedGpuLag = 300;

bool on_off(const std::string& key, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw usage_error("--host: " + key + "='" + v + "' is not on or off");
}

}  // namespace

HostModel default_host_model() {
  HostModel m;
  m.gpu_lag = kCalibratedGpuLag;
  m.autograd_thread = true;
  m.thread_caches = true;
  m.null_stream = true;
  return m;
}

HostModel plain_host_model() { return HostModel{}; }

std::string HostModel::describe() const {
  return "gpu_lag=" + std::to_string(gpu_lag) + ",threads=" + (autograd_thread ? "2" : "1") +
         ",thread_caches=" + (thread_caches ? "on" : "off") +
         ",stream=" + (null_stream ? "null" : "legacy");
}

HostModel parse_host_model(const std::string& text, HostModel base) {
  HostModel m = base;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    if (item == "torch") {
      m = default_host_model();
      continue;
    }
    if (item == "plain") {
      m = plain_host_model();
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      throw usage_error("--host: '" + item + "' is neither torch, plain nor key=value");
    }
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "gpu_lag") {
      char* rest = nullptr;
      const unsigned long long lag = std::strtoull(v.c_str(), &rest, 10);
      if (v.empty() || v[0] == '-' || *rest != '\0' || lag > (1ULL << 40)) {
        throw usage_error("--host: gpu_lag='" + v + "' is not an integer in [0, 2^40]");
      }
      m.gpu_lag = lag;
    } else if (key == "threads") {
      if (v != "1" && v != "2") throw usage_error("--host: threads='" + v + "' is not 1 or 2");
      m.autograd_thread = v == "2";
    } else if (key == "thread_caches") {
      m.thread_caches = on_off(key, v);
    } else if (key == "stream") {
      if (v != "null" && v != "legacy") {
        throw usage_error("--host: stream='" + v + "' is not null or legacy");
      }
      m.null_stream = v == "null";
    } else {
      throw usage_error("--host: unknown key '" + key +
                        "' (gpu_lag, threads, thread_caches, stream; or torch, plain)");
    }
  }
  return m;
}

std::vector<uint8_t> autograd_threads(const trace::Trace& t) {
  std::vector<uint8_t> thread(t.ops.size(), 0);
  // Live bytes after each operation.
  std::vector<uint64_t> live(t.ops.size(), 0);
  std::vector<uint64_t> size_of(t.blocks, 0);
  uint64_t now = 0;
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const trace::TraceOp& op = t.ops[i];
    if (op.type == trace::TraceOp::Type::alloc) {
      size_of[op.block] = op.size;
      now += op.size;
    } else {
      now -= std::min(now, size_of[op.block]);
    }
    live[i] = now;
  }
  const uint64_t min_swing = std::max<uint64_t>(t.peak_live_bytes / 16, 1);
  // A zigzag over live bytes: swings smaller than their threshold are noise inside a phase.
  bool falling = false;
  size_t extreme = 0;         // the running peak (rising) or trough (falling)
  uint64_t last_turn = 0;     // live bytes at the last confirmed turn
  size_t peak_at = 0;         // the confirmed peak the current fall started from
  // The fall from the peak at `from` to the trough at `to`: the autograd thread's operations
  // run from just after the peak until live bytes first come within 1/16 of the fall of the
  // trough (what follows at about that level, the optimizer step, say, is the main thread's).
  auto mark = [&](size_t from, size_t to) {
    const uint64_t near = live[to] + (live[from] - live[to]) / 16;
    for (size_t i = from + 1; i <= to; ++i) {
      thread[i] = 1;
      if (live[i] <= near) break;
    }
  };
  for (size_t i = 0; i < live.size(); ++i) {
    const uint64_t v = live[i];
    if (!falling) {
      if (v >= live[extreme]) {
        extreme = i;
        continue;
      }
      const uint64_t rise = live[extreme] - std::min(live[extreme], last_turn);
      if (live[extreme] - v >= std::max(min_swing, rise / 4)) {
        falling = true;
        peak_at = extreme;
        last_turn = live[extreme];
        extreme = i;
      }
    } else {
      if (v <= live[extreme]) {
        extreme = i;
        continue;
      }
      const uint64_t fall = last_turn - std::min(last_turn, live[extreme]);
      if (v - live[extreme] >= std::max(min_swing, fall / 4)) {
        mark(peak_at, extreme);
        falling = false;
        last_turn = live[extreme];
        extreme = i;
      }
    }
  }
  if (falling) mark(peak_at, extreme);
  return thread;
}

}  // namespace expanse::replay
