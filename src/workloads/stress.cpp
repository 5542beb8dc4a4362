#include "workloads/stress.hpp"

#include "replay/device_streams.hpp"

#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "conf/env_config.hpp"
#include "expanse/errors.hpp"
#include "sim/sim.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <queue>
#include <vector>

namespace expanse::replay {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;
constexpr uint64_t kForever = UINT64_MAX;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// SplitMix64: small, fast, and the same sequence on every platform for a given seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  uint64_t between(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
  // Log-uniform in [lo, hi]: as many 1-2 KiB tensors as 1-2 GiB ones, per octave.
  size_t log_uniform(size_t lo, size_t hi) {
    double a = std::log(static_cast<double>(lo)), b = std::log(static_cast<double>(hi));
    auto v = static_cast<size_t>(std::exp(a + uniform() * (b - a)));
    return std::clamp(v, lo, hi);
  }

 private:
  uint64_t s_;
};

uint64_t pattern(uint64_t seed, uint64_t tag) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (tag + 0x632BE59BD9B4E019ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  return x;
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  uint32_t stream = 0;
  uint64_t tag = 0;
  uint64_t deadline = kForever;  // workload step at which it dies
  bool weight = false;
};

class Workload {
 public:
  Workload(core::DeviceAllocator& a, const DeviceStreams& s, const StressOptions& o,
           StressResult& r)
      : a_(a), s_(s), o_(o), r_(r), rng_(o.seed) {}

  // Fragments the device: live memory about `live_target` bytes in blocks of 512 B .. 1 GiB,
  // with a burst up to `burst_target` that maps pages nearly everywhere; the memory the burst
  // freed stays mapped ("cached") in holes between the blocks that outlive it.
  void run(size_t live_target, size_t burst_target, size_t max_block) {
    target_ = live_target;
    max_block_ = max_block;
    const size_t model = live_target * 3 / 10;  // two models' weights: 30% of the live target
    load_model(model / 2);
    load_model(model / 2);
    const uint64_t steps = 3000;
    for (step_ = 0; step_ < steps; ++step_) {
      if (step_ == steps * 2 / 3) target_ = std::max(live_target, burst_target);
      if (step_ == steps * 2 / 3 + 150) target_ = live_target;
      expire();
      serve_step();
      if (step_ == steps / 2) {  // swap a model: unload half the weights, load another model
        unload_weights(0.5);
        load_model(model / 2);
      }
      if (o_.progress && step_ % 64 == 0) {
        o_.progress(static_cast<double>(step_) / static_cast<double>(steps), "fragmenting");
      }
    }
  }

  // Frees blocks (soonest to die first, weights last) until `bytes` of physical memory are free.
  void make_room(size_t capacity, size_t bytes) {
    while (capacity - a_.stats().touched_bytes < bytes) {
      if (!free_soonest(true)) break;
    }
  }

  // Checks the pattern of every live block (the caller holds a DeviceStreams::Current). Returns
  // the number checked; throws on a mismatch or a failed copy.
  uint64_t verify_live() const {
    uint64_t n = 0;
    for (const Block& b : blocks_) {
      if (b.ptr == nullptr) continue;
      check(b);
      ++n;
    }
    return n;
  }

  uint64_t live_blocks() const { return live_count_; }
  uint64_t live_bytes() const { return live_; }

  // Frees what is left (not counted as workload frees).
  void free_all() {
    counting_ = false;
    for (Block& b : blocks_) {
      if (b.ptr != nullptr) release(b, b.stream);
    }
  }

 private:
  using Due = std::pair<uint64_t, size_t>;  // (deadline, block index)

  void serve_step() {
    // One request on a random stream: activations that die within a few steps, a KV-cache
    // block that lives for hundreds, sometimes a large workspace.
    const auto stream = static_cast<uint32_t>(rng_.below(s_.size()));
    const uint64_t acts = rng_.between(2, 10);
    for (uint64_t i = 0; i < acts; ++i) {
      allocate(rng_.log_uniform(512, 4 * MiB), stream, step_ + rng_.between(1, 3));
    }
    // KV-cache blocks for the request and its batch mates, up to the live target: when the
    // device is "full", the blocks that would die soonest are freed early.
    const size_t kv_max = std::min<size_t>(256 * MiB, max_block_);
    do {
      allocate(rng_.log_uniform(std::min(2 * MiB, kv_max), kv_max), stream,
               step_ + rng_.between(20, 400));
    } while (live_ < target_ / 20 * 19 && rng_.uniform() < 0.9);
    if (rng_.uniform() < 0.05) {
      allocate(rng_.log_uniform(64 * MiB, max_block_), stream, step_ + rng_.between(1, 10));
    }
    if (rng_.uniform() < 0.05 && !blocks_.empty()) {
      // Another stream starts using a live block: its memory is reused only after that work.
      const Block& b = blocks_[rng_.below(blocks_.size())];
      if (b.ptr != nullptr) {
        a_.record_stream(b.ptr, s_[(b.stream + 1) % s_.size()]);
      }
    }
  }

  void load_model(size_t bytes) {
    size_t loaded = 0;
    while (loaded < bytes) {
      // Weight tensors: mostly 1 MiB .. 1 GiB matrices, some small biases and norms.
      size_t sz = rng_.uniform() < 0.3 ? rng_.log_uniform(512, 64 * KiB)
                                       : rng_.log_uniform(MiB, max_block_);
      sz = std::min(sz, bytes - loaded + 512);
      if (!allocate(sz, 0, kForever, true)) break;
      loaded += sz;
      // Staging buffers freed right away leave holes between the weights.
      if (rng_.uniform() < 0.3) allocate(rng_.log_uniform(MiB, 64 * MiB), 0, step_ + 1);
    }
  }

  void unload_weights(double fraction) {
    for (Block& b : blocks_) {
      if (b.ptr != nullptr && b.weight && rng_.uniform() < fraction) release(b, b.stream);
    }
  }

  // Frees due blocks.
  void expire() {
    while (!due_.empty() && due_.top().first <= step_) {
      size_t i = due_.top().second;
      due_.pop();
      Block& b = blocks_[i];
      if (b.ptr == nullptr || b.deadline > step_) continue;
      // One free in ten is ordered on another stream than the allocation's.
      uint32_t on = rng_.uniform() < 0.1 ? static_cast<uint32_t>(rng_.below(s_.size())) : b.stream;
      release(b, on);
    }
  }

  bool free_soonest(bool weights_too) {
    while (!due_.empty()) {
      size_t i = due_.top().second;
      due_.pop();
      Block& b = blocks_[i];
      if (b.ptr == nullptr) continue;
      release(b, b.stream);
      return true;
    }
    if (!weights_too) return false;
    for (Block& b : blocks_) {
      if (b.ptr != nullptr) {
        release(b, b.stream);
        return true;
      }
    }
    return false;
  }

  bool allocate(size_t size, uint32_t stream, uint64_t deadline, bool weight = false) {
    while (live_ + size > target_) {
      if (!free_soonest(false)) return false;
    }
    void* p = nullptr;
    try {
      p = a_.allocate(size, s_[stream]);
    } catch (const out_of_memory&) {
      ++r_.workload_ooms;
      return false;
    }
    size_t i;
    if (!free_slots_.empty()) {
      i = free_slots_.back();
      free_slots_.pop_back();
    } else {
      i = blocks_.size();
      blocks_.emplace_back();
    }
    Block& b = blocks_[i];
    b = Block{p, size, stream, next_tag_++, deadline, weight};
    if (deadline != kForever) due_.push({deadline, i});
    live_ += size;
    ++live_count_;
    ++r_.workload_allocs;
    write(b);
    return true;
  }

  void release(Block& b, uint32_t stream) {
    a_.deallocate(b.ptr, s_[stream]);
    live_ -= b.size;
    --live_count_;
    if (counting_) ++r_.workload_frees;
    b.ptr = nullptr;
    free_slots_.push_back(static_cast<size_t>(&b - blocks_.data()));
  }

  // 8 bytes at the start and at the end of the block (fewer for tiny blocks), copied in with the
  // driver (cuMemcpyHtoD), so the same code runs on the sim and on a real GPU.
  void write(const Block& b) const {
    const uint64_t v = pattern(o_.seed, b.tag);
    auto* p = static_cast<unsigned char*>(b.ptr);
    const size_t n = std::min<size_t>(8, b.size);
    const DeviceStreams::Current current(s_);
    s_.to_device(p, &v, n);
    if (b.size >= 16) s_.to_device(p + b.size - 8, &v, 8);
  }
  // Reads both words back (cuMemcpyDtoH); the caller holds a DeviceStreams::Current.
  void check(const Block& b) const {
    const uint64_t v = pattern(o_.seed, b.tag);
    const auto* p = static_cast<const unsigned char*>(b.ptr);
    const size_t n = std::min<size_t>(8, b.size);
    uint64_t head = 0, tail = v;
    s_.to_host(&head, p, n);
    if (b.size >= 16) s_.to_host(&tail, p + b.size - 8, 8);
    if (std::memcmp(&head, &v, n) != 0 || tail != v) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "live block %p of %zu bytes lost its data", b.ptr, b.size);
      throw std::runtime_error(buf);
    }
  }

  core::DeviceAllocator& a_;
  const DeviceStreams& s_;
  const StressOptions& o_;
  StressResult& r_;
  Rng rng_;
  bool counting_ = true;
  size_t target_ = 0;
  size_t max_block_ = GiB;
  uint64_t step_ = 0;
  uint64_t next_tag_ = 1;
  size_t live_ = 0;
  uint64_t live_count_ = 0;
  std::vector<Block> blocks_;
  std::vector<size_t> free_slots_;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
};

// EXPANSE_CONF with the sim's capacity set (rounded down to its granularity) and host memory
// behind its pages.
std::string stress_conf(const std::string& conf, size_t capacity) {
  if (capacity != 0) {
    const size_t g = sim::sim_config_from_string(conf).granularity;
    if (capacity < g) {
      throw usage_error("stress: --capacity " + conf::format_size(capacity) +
                        " is less than one page of " + conf::format_size(g));
    }
    capacity = capacity / g * g;
  }
  std::string out;
  for (const auto& [k, v] : conf::parse_pairs(conf)) {
    if (k == "sim_backing" || (capacity != 0 && k == "sim_capacity")) continue;
    out += k + ":" + v + ",";
  }
  out += "sim_backing:true";
  if (capacity != 0) out += ",sim_capacity:" + std::to_string(capacity);
  return out;
}

core::DeviceStats minus(const core::DeviceStats& after, const core::DeviceStats& before) {
  core::DeviceStats d;
  for (size_t i = 0; i < d.driver_calls.size(); ++i) {
    d.driver_calls[i] = after.driver_calls[i] - before.driver_calls[i];
  }
  d.modeled_driver_ns = after.modeled_driver_ns - before.modeled_driver_ns;
  return d;
}

// EXPANSE_CONF without one of its keys.
std::string without_key(const std::string& conf, const std::string& key) {
  std::string out;
  for (const auto& [k, v] : conf::parse_pairs(conf)) {
    if (k != key) out += (out.empty() ? "" : ",") + k + ":" + v;
  }
  return out;
}

StressResult run_stress_once(const StressOptions& o) {
  const auto t0 = Clock::now();
  StressResult r;
  r.seed = o.seed;
  r.streams = o.streams;

  std::string conf_text = o.conf;
  if (!o.reserve.empty()) {
    for (const auto& kv : conf::parse_pairs(conf_text)) {
      if (kv.first == "reserve") {
        throw usage_error("stress: --reserve " + o.reserve + " and EXPANSE_CONF reserve:" +
                          kv.second + " both given");
      }
    }
    conf_text += (conf_text.empty() ? "" : ",") + std::string("reserve:") + o.reserve;
  }
  const conf::Config conf = conf::parse_config(conf_text);
  std::unique_ptr<driver::LoadedDriver> drv;
  try {
    drv = driver::select_driver(stress_conf(conf_text, o.capacity), true);
  } catch (const driver::driver_error& e) {
    throw driver_failure(e.what(), static_cast<int>(e.code()));
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  r.driver = drv->description();
  r.sim = drv->kind() == driver::DriverKind::sim;
  r.neighbour = o.neighbour;
  if (o.neighbour && !r.sim) {
    throw usage_error("stress: --neighbour plays another process on the sim; on a GPU, run one");
  }
  // The neighbour lives in the sim's state until this run ends, however it ends.
  struct NeighbourGuard {
    bool on;
    ~NeighbourGuard() {
      if (on) sim::set_neighbour(nullptr);
    }
  } neighbour_guard{o.neighbour};

  std::vector<uint64_t> ids;
  for (int i = 0; i < o.streams; ++i) ids.push_back(static_cast<uint64_t>(i) + 1);
  {
    DeviceStreams streams(*drv, 0, ids);
    core::AllocatorOptions opts;
    {
      // The device's capacity resolves a fractional limit; on a real GPU --capacity is a limit.
      core::DeviceAllocator probe(*drv, 0, conf.allocator);
      opts = conf::options_for_device(conf, probe.capacity());
    }
    if (!r.sim && o.capacity != 0) opts.limit = std::min(opts.limit, o.capacity);
    core::DeviceAllocator a(*drv, 0, opts);
    if (o.neighbour) {  // after the allocators' start-up probes, which release a page each
      sim::set_neighbour([](driver::EntryPoint e, CUresult res, sim::Neighbour& n) {
        if (e == driver::EntryPoint::mem_release && res == CUDA_SUCCESS) n.take(0, SIZE_MAX);
      });
    }
    const size_t page = a.page_size();
    size_t capacity = a.capacity() / page * page;
    if (opts.limit != core::kNoLimit) capacity = std::min(capacity, opts.limit / page * page);
    r.capacity = capacity;
    r.page_size = page;
    r.size = o.size != 0 ? o.size : capacity / 5 * 2 / page * page;
    const size_t need = round_up(r.size, page);
    if (r.size == 0 || need > capacity) {
      throw usage_error("stress: --size " + conf::format_size(r.size) +
                        " does not fit the device's " + conf::format_size(capacity));
    }

    // 1. Fragment: live memory at 90% of what the block leaves free, in blocks up to 1 GiB,
    // after a burst to 92% of the device.
    Workload w(a, streams, o, r);
    const size_t room = capacity - need;
    const auto tw = Clock::now();
    w.run(room / 10 * 9, capacity / 100 * 92,
          std::min<size_t>(GiB, std::max<size_t>(room / 8, 64 * KiB)));
    w.make_room(capacity, need);
    r.workload_seconds = seconds_since(tw);

    const core::DeviceStats before = a.stats();
    r.live_blocks_before = w.live_blocks();
    r.live_bytes_before = w.live_bytes();
    r.touched_bytes_before = before.touched_bytes;
    r.mapped_bytes_before = before.mapped_bytes;
    r.cached_bytes_before = before.cached_bytes;
    r.free_physical_before = capacity - before.touched_bytes;
    r.reserved_bytes = before.reserved_bytes;
    r.reserve_asked_bytes = before.reserve_asked_bytes;
    if (o.neighbour) r.neighbour_bytes = sim::neighbour_holds(0);

    // 2. The contiguous block.
    if (o.progress) o.progress(1.0, "allocating");
    void* big = nullptr;
    const auto ta = Clock::now();
    try {
      big = a.allocate(r.size, streams[0]);
      r.allocated = true;
    } catch (const out_of_memory& e) {
      r.error = e.what();
    }
    r.alloc_seconds = seconds_since(ta);
    const core::DeviceStats after = a.stats();
    r.calls = minus(after, before);
    r.pages_reclaimed = after.num_reclaimed_pages - before.num_reclaimed_pages;
    r.pages_created = after.num_created_pages - before.num_created_pages;
    r.stranded_bytes = after.reserve_stranded_bytes;

    // 3. Verify: a word in every page of the block, then every live block's own pattern, read
    // and written with the driver's copies (cuMemcpyHtoD / cuMemcpyDtoH in device 0's primary
    // context), the same on the sim and on a real GPU.
    if (r.allocated) {
      const auto tv = Clock::now();
      auto* base = static_cast<unsigned char*>(big);
      const size_t pages = (r.size + page - 1) / page;
      auto at = [&](size_t i) { return r.size < 8 ? size_t{0} : std::min(i * page, r.size - 8); };
      const size_t word = std::min<size_t>(8, r.size);
      try {
        const DeviceStreams::Current current(streams);
        for (size_t i = 0; i < pages; ++i) {
          const uint64_t v = pattern(o.seed ^ 0xB16B10C, i);
          streams.to_device(base + at(i), &v, word);
        }
        for (size_t i = 0; i < pages; ++i) {
          uint64_t got = 0;
          const uint64_t want = pattern(o.seed ^ 0xB16B10C, i);
          streams.to_host(&got, base + at(i), word);
          if (std::memcmp(&got, &want, word) != 0) {
            throw std::runtime_error("page " + std::to_string(i) + " of the block reads back " +
                                     "a different value");
          }
          ++r.pages_verified;
        }
        r.live_blocks_verified = w.verify_live();
        r.verified = true;
      } catch (const std::runtime_error& e) {
        r.error = std::string("verification failed: ") + e.what();
      }
      r.verify_seconds = seconds_since(tv);
      if (r.sim) r.host_resident_bytes = sim::resident_bytes(0);
    }
    r.stats = a.stats();
    if (big != nullptr) a.deallocate(big, streams[0]);
    w.free_all();
    r.physical_low_water_bytes = a.stats().physical_low_water_bytes;
  }
  r.wall_seconds = seconds_since(t0);
  return r;
}

}  // namespace

StressResult::OtherRun other_run(const StressOptions& o, const std::string& phase) {
  StressOptions u = o;
  u.unreserved_baseline = false;
  if (o.progress) {
    u.progress = [&o, phase](double f, const std::string& p) { o.progress(f, p + " " + phase); };
  }
  const StressResult b = run_stress_once(u);
  StressResult::OtherRun out;
  out.ran = true;
  out.allocated = b.allocated;
  out.alloc_seconds = b.alloc_seconds;
  out.pages_reclaimed = b.pages_reclaimed;
  out.pages_created = b.pages_created;
  out.physical_low_water_bytes = b.physical_low_water_bytes;
  out.stranded_bytes = b.stranded_bytes;
  out.calls = b.calls;
  out.stats = b.stats;
  return out;
}

StressResult run_stress(const StressOptions& o) {
  StressResult r = run_stress_once(o);
  if (!o.unreserved_baseline || r.reserve_asked_bytes == 0) return r;
  StressOptions u = o;
  u.reserve.clear();
  u.conf = without_key(o.conf, "reserve");
  u.neighbour = false;
  r.unreserved = other_run(u, "(without the reservation)");
  if (o.neighbour) {
    // One-page reserved handles: the reservation's other way never to dip, paid in handles.
    StressOptions one = o;
    one.conf = without_key(o.conf, "reserve_handle_size");
    one.conf += (one.conf.empty() ? "" : ",") + std::string("reserve_handle_size:") +
                std::to_string(r.page_size);
    r.one_page_handles = other_run(one, "(one-page reserved handles)");
  }
  return r;
}

}  // namespace expanse::replay
