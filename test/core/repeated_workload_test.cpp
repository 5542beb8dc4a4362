// Steady state on any repeated workload: a sequence of allocations and frees (random sizes from
// 512 B to hundreds of MiB, random lifetimes, a few streams, frees on other streams and
// record_stream), run three times back to back on one allocator with what a repetition leaves
// live freed before the next (as `expanse replay --repeat` does), makes no driver call in its
// third repetition, whatever the first two did. Random workloads, and workloads shaped like
// training steps (activations growing through the forward pass and freed in reverse by the
// backward pass, gradients, optimizer temporaries, occasional large temporaries), on a roomy
// device and on one barely larger than the workload's peak.
//
// With several streams (frees on other streams, record_stream, a side stream's prefetches) the
// third repetition maps nothing: a stream whose freed memory another wants proves its frees with
// fences recorded at its own calls, and the echo asks them (stream_watch.cpp); the fences
// recorded in the third repetitions are printed beside the frees. Invariant 3 is checked under
// it with held streams and an oracle of the test's own events.
//
// EXPANSE_REPEATED_SEEDS sets the number of seeds per generator (default 40; the soak: 400).
#include "core_fixture.hpp"
#include "support/freed_memory_oracle.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <cmath>
#include <iostream>
#include <sstream>

namespace expanse::test {
namespace {

using driver::EntryPoint;

size_t seeds_per_generator() {
  const char* s = std::getenv("EXPANSE_REPEATED_SEEDS");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 40;
}

// One step of a workload. Blocks are numbered; a block's alloc comes before its free.
struct Op {
  enum Kind : uint8_t { alloc, free, record } kind;
  uint32_t block;
  size_t size;     // alloc
  uint8_t stream;  // the stream the call names
};

struct Workload {
  std::vector<Op> ops;
  uint32_t blocks = 0;
  size_t peak_live = 0;  // bytes requested, at the most
  std::string name;

  uint32_t alloc(size_t size, uint8_t stream) {
    ops.push_back({Op::alloc, blocks, size, stream});
    return blocks++;
  }
  void free(uint32_t b, uint8_t stream) { ops.push_back({Op::free, b, 0, stream}); }
  void record(uint32_t b, uint8_t stream) { ops.push_back({Op::record, b, 0, stream}); }
  // The stream each block was allocated on, and the peak of live bytes.
  void finish() {
    std::vector<size_t> size(blocks, 0);
    size_t live = 0;
    for (const Op& op : ops) {
      if (op.kind == Op::alloc) {
        size[op.block] = op.size;
        live += op.size;
        peak_live = std::max(peak_live, live);
      } else if (op.kind == Op::free) {
        live -= size[op.block];
      }
    }
  }
};

constexpr int kStreams = 3;
constexpr EntryPoint kVmmCalls[] = {EntryPoint::mem_address_reserve, EntryPoint::mem_address_free,
                                    EntryPoint::mem_create, EntryPoint::mem_release,
                                    EntryPoint::mem_map, EntryPoint::mem_unmap,
                                    EntryPoint::mem_set_access};

// A size from 512 B to a few hundred MiB, log-uniform within three bands: small (the small-block
// arena), medium, large.
size_t random_size(std::mt19937_64& rng, int large_percent) {
  auto between = [&](double lo, double hi) {
    std::uniform_real_distribution<double> d(std::log(lo), std::log(hi));
    return static_cast<size_t>(std::exp(d(rng)));
  };
  const int band = static_cast<int>(rng() % 100);
  if (band < large_percent) return between(64.0 * MiB, 400.0 * MiB);
  if (band < 45) return between(1.0 * MiB, 64.0 * MiB);
  return between(512.0, 1.0 * MiB);
}

// Random lifetimes: allocations and frees interleaved at random, most on stream 0, some on the
// others; now and then a block freed on another stream than its own, or used by another stream
// (record_stream) before its free. Runs until `steps` steps or `blocks` allocations, whichever
// comes first, with at most live_cap bytes live.
struct Lifetimes {
  size_t steps = SIZE_MAX;
  uint32_t blocks = UINT32_MAX;
  size_t live_cap = 0;
  int large_percent = 0;
  bool one_stream = false;
};
void random_lifetimes(std::mt19937_64& rng, const Lifetimes& shape, Workload& w) {
  std::vector<std::pair<uint32_t, uint8_t>> live;  // block, its stream
  size_t live_bytes = 0;
  std::vector<size_t> size;
  auto pick_stream = [&]() -> uint8_t {
    if (shape.one_stream) return 0;
    return rng() % 4 == 0 ? static_cast<uint8_t>(1 + rng() % (kStreams - 1)) : 0;
  };
  for (size_t i = 0; i < shape.steps && w.blocks < shape.blocks; ++i) {
    const bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      const size_t n = random_size(rng, shape.large_percent);
      if (live_bytes + n > shape.live_cap) continue;
      const uint8_t s = pick_stream();
      const uint32_t b = w.alloc(n, s);
      size.resize(w.blocks, 0);
      size[b] = n;
      live.emplace_back(b, s);
      live_bytes += n;
      continue;
    }
    // Mostly the latest blocks die first (temporaries), sometimes any.
    const size_t k = rng() % 3 == 0 ? rng() % live.size()
                                    : live.size() - 1 - rng() % std::min<size_t>(live.size(), 4);
    const auto [b, s] = live[k];
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    live_bytes -= size[b];
    const int r = static_cast<int>(rng() % 100);
    uint8_t fs = s;
    if (shape.one_stream) {
    } else if (r < 4) {
      fs = static_cast<uint8_t>((s + 1) % kStreams);  // freed on another stream
    } else if (r < 8) {
      w.record(b, static_cast<uint8_t>((s + 1 + rng() % (kStreams - 1)) % kStreams));
    }
    w.free(b, fs);
  }
  w.finish();
}

Workload random_workload(uint64_t seed, bool one_stream) {
  std::mt19937_64 rng(seed);
  Workload w;
  w.name = "random";
  Lifetimes shape;
  shape.steps = 150 + rng() % 350;
  shape.live_cap = (1 + rng() % 4) * GiB;
  shape.large_percent = static_cast<int>(rng() % 12);
  shape.one_stream = one_stream;
  random_lifetimes(rng, shape, w);
  return w;
}

// A training step: weights allocated once (before the first repetition; never freed), then per
// step a forward pass whose activations pile up layer by layer (some temporaries freed at once),
// a loss with a large temporary, a backward pass freeing activations in reverse while gradients
// appear, and an optimizer step with per-weight temporaries; gradients are dropped at the end. A
// side stream now and then carries a prefetch whose block the main stream frees.
struct TrainingShape {
  std::vector<size_t> weights;
  Workload step;
};

TrainingShape training_workload(uint64_t seed, bool one_stream) {
  std::mt19937_64 rng(seed);
  TrainingShape t;
  Workload& w = t.step;
  w.name = "training";
  const size_t layers = 2 + rng() % 14;
  const size_t hidden = size_t{1} << (18 + rng() % 6);  // 256 KiB .. 8 MiB per token slice
  const size_t batch = 1 + rng() % 16;
  std::vector<size_t> act_sizes;  // per layer, the shapes of its activations
  const size_t per_layer = 2 + rng() % 5;
  for (size_t i = 0; i < per_layer; ++i) {
    act_sizes.push_back(hidden * batch * (1 + rng() % 4) + (rng() % 3 == 0 ? 512 * (rng() % 7) : 0));
  }
  for (size_t l = 0; l < layers; ++l) {
    for (size_t i = 0; i < 2 + rng() % 3; ++i) {
      t.weights.push_back(hidden * (1 + rng() % 8) / (1 + rng() % 4) + 512 * (rng() % 5));
    }
  }
  const bool side_stream = !one_stream && rng() % 2 == 0;
  std::vector<std::vector<uint32_t>> acts(layers);
  // Forward.
  for (size_t l = 0; l < layers; ++l) {
    if (side_stream && rng() % 3 == 0) {  // a prefetch on stream 1, used and freed on stream 0
      const uint32_t p = w.alloc(hidden * (1 + rng() % 4), 1);
      w.record(p, 0);
      acts[l].push_back(p);
    }
    for (size_t i = 0; i < per_layer; ++i) {
      const uint32_t a = w.alloc(act_sizes[i] + (l % 2) * 512, 0);
      if (rng() % 4 == 0) {
        const uint32_t tmp = w.alloc(act_sizes[(i + 1) % per_layer] / 2 + 512, 0);
        w.free(tmp, 0);
      }
      acts[l].push_back(a);
    }
    if (rng() % 10 == 0) {  // an occasional small bookkeeping tensor
      const uint32_t s = w.alloc(512 * (1 + rng() % 64), 0);
      acts[l].push_back(s);
    }
  }
  // Loss: a large temporary (logits), hundreds of MiB.
  const uint32_t logits = w.alloc((64 + rng() % 400) * MiB + 512 * (rng() % 3), 0);
  const uint32_t dlogits = w.alloc(logits == 0 ? MiB : w.ops.back().size, 0);
  w.free(logits, 0);
  std::vector<uint32_t> grads;
  // Backward: gradients of activations, weight gradients; activations freed in reverse.
  uint32_t carry = dlogits;
  for (size_t l = layers; l-- > 0;) {
    const uint32_t g = w.alloc(act_sizes[0], 0);
    w.free(carry, 0);
    carry = g;
    for (size_t i = 0; i < 2; ++i) grads.push_back(w.alloc(hidden * (1 + (l + i) % 8) / 2, 0));
    for (auto it = acts[l].rbegin(); it != acts[l].rend(); ++it) w.free(*it, 0);
  }
  w.free(carry, 0);
  // Optimizer: a temporary per gradient, then the gradients go (set to None).
  for (uint32_t g : grads) {
    const uint32_t tmp = w.alloc(hidden / 2 + 512 * (g % 3), 0);
    w.free(tmp, 0);
  }
  for (uint32_t g : grads) w.free(g, 0);
  w.finish();
  return t;
}

class RepeatedWorkloadTest : public CoreTest {
 protected:
  // Runs w `reps` times (weights first, once); the work calls (core_fixture.hpp) each repetition
  // made, and a description of the third's calls per entry point.
  std::vector<uint64_t> run(const Workload& w, const std::vector<size_t>& weights, int reps,
                            std::string* third, bool vmm_only) {
    std::vector<CUstream> streams;
    for (int i = 0; i < kStreams; ++i) streams.push_back(new_stream());
    std::vector<void*> kept;
    for (size_t n : weights) kept.push_back(alloc_->allocate(n, streams[0]));
    std::vector<uint64_t> out;
    std::vector<void*> ptr(w.blocks, nullptr);
    std::vector<uint8_t> stream_of(w.blocks, 0);
    for (int rep = 1; rep <= reps; ++rep) {
      std::vector<uint64_t> before(driver::kEntryPointCount);
      for (int e = 0; e < driver::kEntryPointCount; ++e) {
        before[static_cast<size_t>(e)] = sim::call_count(static_cast<EntryPoint>(e));
      }
      const uint64_t calls = work_calls();
      for (const Op& op : w.ops) {
        switch (op.kind) {
          case Op::alloc:
            ptr[op.block] = alloc_->allocate(op.size, streams[op.stream]);
            stream_of[op.block] = op.stream;
            break;
          case Op::record:
            alloc_->record_stream(ptr[op.block], streams[op.stream]);
            break;
          case Op::free:
            alloc_->deallocate(ptr[op.block], streams[op.stream]);
            ptr[op.block] = nullptr;
            break;
        }
      }
      for (uint32_t b = 0; b < w.blocks; ++b) {
        if (ptr[b] != nullptr) alloc_->deallocate(ptr[b], streams[stream_of[b]]);
        ptr[b] = nullptr;
      }
      uint64_t vmm = 0;
      for (EntryPoint e : kVmmCalls) vmm += sim::call_count(e) - before[static_cast<size_t>(e)];
      out.push_back(vmm_only ? vmm : work_calls() - calls);
      if (rep == 3) {
        third_records_ += sim::call_count(EntryPoint::event_record) -
                          before[static_cast<size_t>(EntryPoint::event_record)];
        third_frees_ += w.blocks;  // each block is freed once a repetition
      }
      if (rep == 3 && third != nullptr) {
        std::ostringstream s;
        for (int e = 0; e < driver::kEntryPointCount; ++e) {
          const uint64_t n = sim::call_count(static_cast<EntryPoint>(e)) - before[static_cast<size_t>(e)];
          if (n != 0) s << driver::entry_point_name(static_cast<EntryPoint>(e)) << " " << n << "; ";
        }
        *third = s.str();
      }
    }
    for (void* p : kept) alloc_->deallocate(p, streams[0]);
    return out;
  }

  // Every seed's third repetition, on a device of `capacity(peak live)`: the seeds that made
  // driver calls there, with what they made.
  // *bad_seeds: how many seeds made calls (of `seeds`, default seeds_per_generator()).
  template <class Gen, class Cap>
  std::string failures(Gen gen, Cap capacity, uint64_t first_seed, bool vmm_only = false,
                       size_t seeds = 0, size_t* bad_seeds = nullptr) {
    std::ostringstream bad;
    size_t n_bad = 0;
    if (seeds == 0) seeds = seeds_per_generator();
    for (uint64_t seed = first_seed; seed < first_seed + seeds; ++seed) {
      std::vector<size_t> weights;
      Workload w = gen(seed, &weights);
      size_t kept = 0;
      for (size_t n : weights) kept += n;
      const size_t cap = round_up(capacity(w.peak_live + kept), 2 * MiB);
      make(sim_config(cap, false));
      std::string third;
      const std::vector<uint64_t> calls = run(w, weights, 3, &third, vmm_only);
      EXPECT_EQ(alloc_->check_invariants(), "") << w.name << " seed " << seed;
      if (calls[2] != 0) {
        if (n_bad++ < 8) {
          bad << w.name << " seed " << seed << " (peak live " << (w.peak_live + kept) / MiB
              << " MiB, device " << cap / MiB << " MiB): calls per repetition " << calls[0]
              << " / " << calls[1] << " / " << calls[2] << " [" << third << "]\n";
        }
      }
      alloc_.reset();
      for (CUstream s : streams_) drv_->table().stream_destroy(s);
      streams_.clear();
    }
    if (n_bad != 0) bad << n_bad << " of " << seeds << " seeds made calls\n";
    // What proving other streams' frees costs: fences recorded in the third repetitions.
    std::cout << "third repetitions: " << third_records_ << " cuEventRecord for " << third_frees_
              << " frees\n";
    third_records_ = third_frees_ = 0;
    if (bad_seeds != nullptr) *bad_seeds = n_bad;
    return bad.str();
  }
  static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
  uint64_t third_records_ = 0;  // over the seeds of one failures() call
  uint64_t third_frees_ = 0;
};

// Generators: one stream (every call counts) or several (stream fences may be needed to prove
// other streams' frees done; the calls that count are those that map and unmap).
Workload one_stream_random(uint64_t seed, std::vector<size_t>*) {
  return random_workload(seed, true);
}
Workload streams_random(uint64_t seed, std::vector<size_t>*) {
  return random_workload(seed, false);
}
Workload one_stream_training(uint64_t seed, std::vector<size_t>* weights) {
  TrainingShape t = training_workload(seed, true);
  *weights = t.weights;
  return t.step;
}
Workload streams_training(uint64_t seed, std::vector<size_t>* weights) {
  TrainingShape t = training_workload(seed, false);
  *weights = t.weights;
  return t.step;
}
size_t roomy(size_t peak) { return 2 * peak + 1 * GiB; }
// Barely more than the peak: placement must reuse memory, and reclaim may be needed.
size_t tight(size_t peak) { return peak + peak / 8 + 256 * MiB; }

TEST_F(RepeatedWorkloadTest, RandomWorkloadMakesNoCallInItsThirdRepetition) {
  EXPECT_EQ(failures(one_stream_random, roomy, 1), "");
}

TEST_F(RepeatedWorkloadTest, TrainingStepMakesNoCallInItsThirdRepetition) {
  EXPECT_EQ(failures(one_stream_training, roomy, 1000), "");
}

// On a device barely larger than its peak, a random workload's layout may span more pages than
// the device holds; reclaim then moves pages in every repetition (what the echo repeats is
// placement, not which pages are mapped). Bounded here: measured 2 of 400 seeds (2021, 2080) and
// 32 of 4000.
TEST_F(RepeatedWorkloadTest, RandomWorkloadRarelyRemapsInItsThirdRepetitionOnATightDevice) {
  size_t bad = 0;
  const size_t seeds = 10 * seeds_per_generator();
  const std::string why = failures(one_stream_random, tight, 2000, false, seeds, &bad);
  EXPECT_LE(bad * 100, seeds) << why;
}

TEST_F(RepeatedWorkloadTest, TrainingStepMakesNoCallInItsThirdRepetitionOnATightDevice) {
  EXPECT_EQ(failures(one_stream_training, tight, 3000), "");
}

// Several streams: memory freed on one stream is another's only once a fence proves it done
// (invariant 3), and a fence can be recorded only during the freeing stream's own calls. Frees
// another stream will want (blocks other streams used or had freed before, memory an allocation
// wanted while unproven) record one at the free, and the echo asks it (stream_watch.cpp).
TEST_F(RepeatedWorkloadTest, RandomWorkloadOnSeveralStreamsMapsNothingInItsThirdRepetition) {
  EXPECT_EQ(failures(streams_random, roomy, 4000, true), "");
}

// A side stream that allocates once a step proves its use of a block the main stream freed at
// its next call only (its handle can be trusted then, not before). When a repetition's layout
// puts a main-stream allocation made before that call where the side stream's block was, the
// next repetition cannot repeat it: that allocation goes elsewhere once more, and the workload
// settles a repetition later. Such layouts come from a second repetition whose first
// allocations found no echo (their points name the previous repetition's last operations);
// short points (placement_echo.hpp) place most of those as the repetition before did. The name says the goal; the test bounds
// the rate at 1 % of 10 seeds per EXPANSE_REPEATED_SEEDS: measured 0 of 400, 0 of 4000 and 1 of
// 10000 seeds (12768: a repetition's very first allocation, which no history names).
TEST_F(RepeatedWorkloadTest, TrainingStepWithASideStreamMapsNothingInItsThirdRepetition) {
  size_t bad = 0;
  const size_t seeds = 10 * seeds_per_generator();
  const std::string why = failures(streams_training, roomy, 5000, true, seeds, &bad);
  EXPECT_LE(bad * 100, seeds) << why;
}

// The seeds of 4000 that settle only in their fourth repetition without short points: the
// second repetition's side-stream allocation, with no echo, takes memory the main stream has just
// freed, a layout the third repetition cannot repeat.
TEST_F(RepeatedWorkloadTest, SideStreamSeedsThatNeedShortPointsSettleInTheThird) {
  for (uint64_t seed : {5543, 5763, 5959, 6034, 7001, 7328, 7424, 8980}) {
    EXPECT_EQ(failures(streams_training, roomy, seed, true, 1), "") << seed;
  }
}

// A repetition of many allocations (random lifetimes, three streams, frees on other streams and
// record_stream): it settles by its third repetition as long as the echo's table holds a
// repetition's points and short points (two slots an allocation) without starting over. With a
// table of 2^18 slots it starts over every ~65,000 allocations and every repetition of 90,000
// maps again (300 to 500 VMM calls). EXPANSE_LONG_ALLOCS sets the allocations per repetition.
TEST_F(RepeatedWorkloadTest, ALongRepetitionOnSeveralStreamsMapsNothingInItsThird) {
#ifdef EXPANSE_CHECKED
  // Every call checks the books of thousands of blocks there: far too slow, and what it checks
  // (driver calls) the release build checks as well.
  GTEST_SKIP() << "too slow in the checked build";
#endif
  const char* env = std::getenv("EXPANSE_LONG_ALLOCS");
  const uint32_t allocs = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                                         : 90000;
  for (uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 rng(seed);
    Workload w;
    w.name = "long";
    Lifetimes shape;
    shape.blocks = allocs;
    shape.live_cap = 2 * GiB;
    shape.large_percent = 2;
    random_lifetimes(rng, shape, w);
    make(sim_config(round_up(2 * w.peak_live + 1 * GiB, 2 * MiB), false));
    std::string third;
    const std::vector<uint64_t> calls = run(w, {}, 3, &third, true);
    std::cout << "seed " << seed << ", " << allocs << " allocations a repetition: VMM calls "
              << calls[0] << " / " << calls[1] << " / " << calls[2] << "\n";
    EXPECT_EQ(calls[2], 0u) << "seed " << seed << " [" << third << "]";
    alloc_.reset();
    for (CUstream s : streams_) drv_->table().stream_destroy(s);
    streams_.clear();
  }
}

// Invariant 3 under the settling (stream_watch.cpp): the same workloads, four repetitions, with
// streams held now and then (their work stays pending until released). Before every free the
// test records its own event on every stream that may still use the block (the freeing stream,
// the allocating stream, record_stream users); an allocation on stream T may overlap the block
// only once every such event on a stream other than T is complete.
TEST_F(RepeatedWorkloadTest, HeldStreamsKeepTheirFreedMemoryFromOtherStreams) {
  size_t checked = 0, blocked = 0;
  for (uint64_t seed = 6000; seed < 6000 + seeds_per_generator(); ++seed) {
    std::vector<size_t> weights;
    const Workload w = seed % 2 == 0 ? streams_random(seed, &weights)
                                     : streams_training(seed, &weights);
    size_t kept = 0;
    for (size_t n : weights) kept += n;
    make(sim_config(round_up(roomy(w.peak_live + kept), 2 * MiB), false));
    const auto& t = drv_->table();
    PrimaryCtx ctx(t);
    std::vector<CUstream> streams;
    for (int i = 0; i < kStreams; ++i) streams.push_back(new_stream());
    std::vector<void*> weight_ptrs;
    for (size_t n : weights) weight_ptrs.push_back(alloc_->allocate(n, streams[0]));
    std::mt19937_64 rng(seed);
    std::vector<bool> held(kStreams, false);
    using Oracle = FreedMemoryOracle<StreamUse<int>>;  // streams by index
    Oracle oracle(t);
    auto destroy = [&](const StreamUse<int>& u) { t.event_destroy(u.event); };
    std::vector<void*> ptr(w.blocks, nullptr);
    std::vector<size_t> size(w.blocks, 0);
    std::vector<std::vector<int>> users(w.blocks);
    auto free_block = [&](uint32_t b, int s) {
      Oracle::Freed f{reinterpret_cast<uintptr_t>(ptr[b]), size[b], s, {}, {}};
      std::vector<int> us = users[b];
      us.push_back(s);
      for (int u : us) {
        CUevent e = nullptr;
        ASSERT_EQ(t.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        ASSERT_EQ(t.event_record(e, streams[static_cast<size_t>(u)]), CUDA_SUCCESS);
        f.uses.push_back({u, e});
      }
      alloc_->deallocate(ptr[b], streams[static_cast<size_t>(s)]);
      ptr[b] = nullptr;
      oracle.freed(std::move(f));
    };
    for (int rep = 0; rep < 4; ++rep) {
      for (const Op& op : w.ops) {
        if (rng() % 100 < 3) {  // hold or release a stream
          const size_t s = rng() % kStreams;
          held[s] ? sim::release_stream(streams[s]) : sim::hold_stream(streams[s]);
          held[s] = !held[s];
        }
        if (op.kind == Op::alloc) {
          void* p = alloc_->allocate(op.size, streams[op.stream]);
          ptr[op.block] = p;
          size[op.block] = op.size;
          users[op.block] = {op.stream};
          const auto x = reinterpret_cast<uintptr_t>(p);
          oracle.check_allocation(x, op.size, op.stream,
                                  [&](const Oracle::Freed&, const StreamUse<int>& u) {
                                    ADD_FAILURE() << w.name << " seed " << seed << " repetition "
                                                  << rep + 1 << ": block " << op.block
                                                  << " on stream " << int{op.stream}
                                                  << " overlaps memory freed while stream "
                                                  << u.stream << "'s work on it was pending";
                                  });
          blocked += oracle.pending_uses_of_others(op.stream);
          oracle.forget_done(destroy);
          ++checked;
        } else if (op.kind == Op::record) {
          alloc_->record_stream(ptr[op.block], streams[op.stream]);
          users[op.block].push_back(op.stream);
        } else {
          free_block(op.block, op.stream);
        }
      }
      for (uint32_t b = 0; b < w.blocks; ++b) {
        if (ptr[b] != nullptr) free_block(b, users[b].front());
      }
    }
    EXPECT_EQ(alloc_->check_invariants(), "") << w.name << " seed " << seed;
    for (int s = 0; s < kStreams; ++s) {
      if (held[static_cast<size_t>(s)]) sim::release_stream(streams[static_cast<size_t>(s)]);
    }
    oracle.clear(destroy);
    for (void* p : weight_ptrs) alloc_->deallocate(p, streams[0]);
    alloc_.reset();
    for (CUstream s : streams_) t.stream_destroy(s);
    streams_.clear();
  }
  EXPECT_GT(blocked, 0u) << "no allocation met memory whose streams' work was pending";
  EXPECT_GT(checked, 0u);
  std::printf("allocations checked %zu, pending uses of other streams met %zu\n", checked,
              blocked);
}

}  // namespace
}  // namespace expanse::test
