// Releases a snapshot does not mark (torch.cuda.empty_cache() calls, free-and-retries after a
// failed cudaMalloc): found from small hand-made snapshots and from recordings the project's own
// model of PyTorch's allocator makes, and replayed so that the model reproduces the recording.
#include "models/torch_caching_model.hpp"
#include "models/torch_model_run.hpp"
#include "replay/replay.hpp"
#include "trace/release_inference.hpp"
#include "tools_test_util.hpp"

#include "conf/env_config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace expanse::test {
namespace {

using replay::check_torch_model;
using replay::TorchCachingModel;
using replay::TorchSegmentEvent;
using trace::load_snapshot;
using trace::Trace;
using trace::TraceRelease;
using Kind = TraceRelease::Kind;

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr uint64_t A = 0x10000000, B = 0x20000000, C = 0x30000000, S = 0x40000000;

struct Want {
  Kind kind;
  uint64_t op;
  bool before_oom = false;
};

void expect_releases(const Trace& t, const std::vector<Want>& want) {
  ASSERT_EQ(t.releases.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(t.releases[i].kind, want[i].kind);
    EXPECT_EQ(t.releases[i].op, want[i].op);
    EXPECT_EQ(t.releases[i].before_oom, want[i].before_oom);
  }
}

// The model, from the recorded start state, against the recording: every segment event
// reproduced and the same peak reserved.
void expect_reproduced(const Trace& t) {
  const replay::TorchAgreement a =
      check_torch_model(t, t.torch->settings.value_or(trace::TorchSettings{}));
  EXPECT_TRUE(a.from_recorded_state);
  EXPECT_EQ(a.reproduced_events, a.recorded_events);
  EXPECT_EQ(a.model_events, a.recorded_events);
  EXPECT_EQ(a.model_peak_reserved, a.recorded_peak_reserved);
  EXPECT_FALSE(a.first_difference_op.has_value());
}

Trace without_releases(Trace t) {
  t.releases.clear();
  return t;
}

// Two 12 MiB tensors in their own segments; the first is freed and its segment released
// (empty_cache) between two frees, so no allocation follows the release; the second's segment
// then serves a third tensor.
std::vector<SnapEvent> empty_cache_between_frees() {
  return {{"segment_alloc", A, 12 * MiB}, {"alloc", A, 12 * MiB},
          {"segment_alloc", C, 12 * MiB}, {"alloc", C, 12 * MiB},
          {"free_completed", A, 12 * MiB}, {"segment_free", A, 12 * MiB},
          {"free_completed", C, 12 * MiB}, {"alloc", C, 12 * MiB}};
}

// A 12 MiB tensor, freed; its segment released right before a 14 MiB tensor's new segment,
// which brings the reserved memory past its highest (12 MiB): the device refused it.
std::vector<SnapEvent> free_and_retry(const std::string& free_frame = "") {
  return {{"segment_alloc", A, 12 * MiB},
          {"alloc", A, 12 * MiB},
          {"free_completed", A, 12 * MiB},
          {"segment_free", A, 12 * MiB, 0, free_frame},
          {"segment_alloc", B, 14 * MiB},
          {"alloc", B, 14 * MiB},
          {"free_completed", B, 14 * MiB}};
}

TEST(ReleaseInference, EmptyCacheWithNoAllocationAfterIt) {
  const Trace t = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, C, 12 * MiB, {{C, 12 * MiB}}}}, {empty_cache_between_frees()}));
  expect_releases(t, {{Kind::empty_cache, 3}});
  EXPECT_EQ(t.releases[0].segment_frees, 1u);
  EXPECT_EQ(t.releases[0].bytes, 12 * MiB);
  expect_reproduced(t);
  // Without it the model keeps the segment: the recorded segment_free is not reproduced.
  const auto a = check_torch_model(without_releases(t), trace::TorchSettings{});
  EXPECT_EQ(a.reproduced_events, a.recorded_events - 1);
}

TEST(ReleaseInference, FreeAndRetryBeforeASegmentPastThePeak) {
  const Trace t = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, B, 14 * MiB, {{B, 14 * MiB, "inactive"}}}}, {free_and_retry()}));
  expect_releases(t, {{Kind::free_and_retry, 2}});
  EXPECT_EQ(t.torch_peak_reserved_bytes, 14 * MiB);
  expect_reproduced(t);
  // Without it the model keeps the 12 MiB segment and reserves both.
  const auto a = check_torch_model(without_releases(t), trace::TorchSettings{});
  EXPECT_EQ(a.model_peak_reserved, 26 * MiB);
}

// With max_split_size, PyTorch first releases only oversize cached segments until they add up
// to the request; when the retry then succeeds, the other cached segments stay. The model
// releases as much as the recording did, not everything.
TEST(ReleaseInference, FreeAndRetryReleasesWhatTheRecordingDid) {
  constexpr uint64_t D = 0x50000000, E = 0x60000000;
  const std::vector<SnapEvent> ev = {
      {"segment_alloc", A, 14 * MiB}, {"alloc", A, 14 * MiB},
      {"segment_alloc", B, 14 * MiB}, {"alloc", B, 14 * MiB},
      {"segment_alloc", D, 2 * MiB},  {"alloc", D, 4096},
      {"free_completed", A, 14 * MiB}, {"free_completed", B, 14 * MiB},
      {"free_completed", D, 4096},
      // A 20 MiB request: no cached block fits, cudaMalloc fails, the two oversize segments go.
      {"segment_free", B, 14 * MiB},  {"segment_free", A, 14 * MiB},
      {"segment_alloc", E, 20 * MiB}, {"alloc", E, 20 * MiB}};
  Trace t = load_snapshot(
      "s.pickle", snapshot_pickle({{0, D, 2 * MiB, {{D, 2 * MiB, "inactive"}}},
                                   {0, E, 20 * MiB, {{E, 20 * MiB}}}},
                                  {ev}));
  trace::TorchSettings s;
  s.max_split_size = 12 * MiB;
  t.torch->settings = s;
  trace::infer_releases(t);
  expect_releases(t, {{Kind::free_and_retry, 6}});
  EXPECT_EQ(t.releases[0].bytes, 28 * MiB);
  const replay::TorchAgreement a = check_torch_model(t, s);
  EXPECT_EQ(a.reproduced_events, a.recorded_events);
  EXPECT_EQ(a.model_events, a.recorded_events);
  EXPECT_EQ(a.model_peak_reserved, a.recorded_peak_reserved);
}

TEST(ReleaseInference, RecordedStackNamingEmptyCacheDecides) {
  for (const char* frame : {"empty_cache", "c10::cuda::CUDACachingAllocator::emptyCache()"}) {
    SCOPED_TRACE(frame);
    const Trace t = load_snapshot(
        "s.pickle",
        snapshot_pickle({{0, B, 14 * MiB, {{B, 14 * MiB, "inactive"}}}}, {free_and_retry(frame)}));
    expect_releases(t, {{Kind::empty_cache, 2}});
    expect_reproduced(t);
  }
}

TEST(ReleaseInference, ReleaseBeforeANewSegmentBelowThePeakIsEmptyCache) {
  // 26 MiB reserved at the peak; after the first release 12 MiB. The second release comes right
  // before a 2 MiB segment, but 12 + 2 MiB is below the 26 MiB the device already held: the
  // cudaMalloc cannot have failed, so the program called empty_cache().
  const std::vector<SnapEvent> ev = {
      {"segment_alloc", A, 12 * MiB}, {"alloc", A, 12 * MiB},
      {"segment_alloc", C, 14 * MiB}, {"alloc", C, 14 * MiB},
      {"free_completed", C, 14 * MiB}, {"segment_free", C, 14 * MiB},
      {"free_completed", A, 12 * MiB}, {"segment_free", A, 12 * MiB},
      {"segment_alloc", S, 2 * MiB},  {"alloc", S, 4096}};
  const Trace t = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, S, 2 * MiB, {{S, 4096}, {S + 4096, 2 * MiB - 4096, "inactive"}}}},
                      {ev}));
  expect_releases(t, {{Kind::empty_cache, 3}, {Kind::empty_cache, 4}});
  expect_reproduced(t);
}

TEST(ReleaseInference, ReleaseBeforeAnOomIsTheFailedAllocationsRetry) {
  const std::vector<SnapEvent> ev = {{"segment_alloc", A, 12 * MiB}, {"alloc", A, 12 * MiB},
                                     {"free_completed", A, 12 * MiB}, {"segment_free", A, 12 * MiB},
                                     {"oom", 0, 100 * MiB},           {"segment_alloc", S, 2 * MiB},
                                     {"alloc", S, 4096}};
  const Trace t = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, S, 2 * MiB, {{S, 4096}, {S + 4096, 2 * MiB - 4096, "inactive"}}}},
                      {ev}));
  expect_releases(t, {{Kind::free_and_retry, 2, true}});
  expect_reproduced(t);
}

TEST(ReleaseInference, EmptyCacheAfterTheLastOperation) {
  const std::vector<SnapEvent> ev = {{"segment_alloc", A, 12 * MiB},
                                     {"alloc", A, 12 * MiB},
                                     {"free_completed", A, 12 * MiB},
                                     {"segment_free", A, 12 * MiB}};
  const Trace t = load_snapshot("s.pickle", snapshot_pickle({}, {ev}));
  expect_releases(t, {{Kind::empty_cache, 2}});
  expect_reproduced(t);
}

TEST(ReleaseInference, TraceWithoutReleasesIsUnchanged) {
  const std::vector<SnapEvent> ev = {{"segment_alloc", A, 20 * MiB},
                                     {"alloc", A, 3 * MiB},
                                     {"alloc", A + 3 * MiB, 3 * MiB},
                                     {"free_completed", A, 3 * MiB},
                                     {"alloc", A, 3 * MiB}};
  const Trace t = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, A, 20 * MiB, {{A, 3 * MiB}, {A + 3 * MiB, 3 * MiB}}}}, {ev}));
  EXPECT_TRUE(t.releases.empty());
  expect_reproduced(t);
  replay::TorchRunOptions on, off;
  off.inferred_releases = false;
  const auto r1 = replay::run_torch_model(t, trace::TorchSettings{}, on);
  const auto r2 = replay::run_torch_model(t, trace::TorchSettings{}, off);
  EXPECT_EQ(r1.peak_reserved, r2.peak_reserved);
  EXPECT_EQ(r1.segment_events.size(), r2.segment_events.size());
}

uint64_t unmaps(const replay::TorchRun& r) {
  return static_cast<uint64_t>(
      std::count_if(r.segment_events.begin(), r.segment_events.end(), [](const auto& e) {
        return e.kind == TorchSegmentEvent::Kind::segment_unmap;
      }));
}

// The expandable-segments model makes the releases too: an empty_cache() unmaps its free pages,
// and a free-and-retry makes the allocation that needs more pages unmap the free ones first.
// Here 30 MiB is freed and its segment released, then 44 MiB asked for: the two 20 MiB pages
// mapped for the first do not hold the second, so without a release the model maps a third.
TEST(ReleaseInference, ExpandableModelMakesTheReleases) {
  trace::TorchSettings s;
  s.expandable_segments = true;
  for (const char* frame : {"", "empty_cache"}) {
    SCOPED_TRACE(frame);
    const std::vector<SnapEvent> ev = {{"segment_alloc", A, 30 * MiB},
                                       {"alloc", A, 30 * MiB},
                                       {"free_completed", A, 30 * MiB},
                                       {"segment_free", A, 30 * MiB, 0, frame},
                                       {"segment_alloc", B, 44 * MiB},
                                       {"alloc", B, 44 * MiB}};
    const Trace t =
        load_snapshot("s.pickle", snapshot_pickle({{0, B, 44 * MiB, {{B, 44 * MiB}}}}, {ev}));
    expect_releases(t, {{*frame != 0 ? Kind::empty_cache : Kind::free_and_retry, 2}});
    const replay::TorchRun with = replay::run_torch_model(t, s, {});
    EXPECT_EQ(unmaps(with), 1u);
    EXPECT_EQ(with.peak_reserved, 60 * MiB);
    for (const auto& e : with.segment_events) {
      if (e.kind == TorchSegmentEvent::Kind::segment_unmap) {
        EXPECT_EQ(e.op, 2u);
      }
    }
    EXPECT_EQ(unmaps(replay::run_torch_model(without_releases(t), s, {})), 0u);
  }
}

// expanse gives its cache back at an empty_cache() (the program's call) and makes no release for
// a free-and-retry (PyTorch's answer to its own device running out).
TEST(ReleaseInference, ExpanseReleasesOnlyAtEmptyCache) {
  const conf::Config conf = conf::parse_config("");
  constexpr uint64_t GiB = uint64_t{1} << 30;
  const Trace ec = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, C, 12 * MiB, {{C, 12 * MiB}}}}, {empty_cache_between_frees()}));
  const auto with = replay::replay_trace(ec, conf, 8 * GiB);
  const auto without = replay::replay_trace(without_releases(ec), conf, 8 * GiB);
  EXPECT_GT(with.stats.total_driver_calls(), without.stats.total_driver_calls());

  const Trace fr = load_snapshot(
      "s.pickle",
      snapshot_pickle({{0, B, 14 * MiB, {{B, 14 * MiB, "inactive"}}}}, {free_and_retry()}));
  const auto r1 = replay::replay_trace(fr, conf, 8 * GiB);
  const auto r2 = replay::replay_trace(without_releases(fr), conf, 8 * GiB);
  EXPECT_EQ(r1.stats.total_driver_calls(), r2.stats.total_driver_calls());
  EXPECT_EQ(r1.stats.peak_physical_bytes, r2.stats.peak_physical_bytes);
}

TEST(ReleaseInference, CompareReportsTheCounts) {
  TempDir dir;
  const std::string f = dir.write(
      "s.pickle",
      snapshot_pickle({{0, B, 14 * MiB, {{B, 14 * MiB, "inactive"}}}}, {free_and_retry()}));
  RunResult r = run_expanse("replay '" + f + "' --compare --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& a = j["compare"]["pytorch_model_agreement"];
  EXPECT_EQ(a["inferred_empty_cache_calls"].get<uint64_t>(), 0u);
  EXPECT_EQ(a["inferred_free_and_retries"].get<uint64_t>(), 1u);
  EXPECT_EQ(a["inferred_segment_frees"].get<uint64_t>(), 1u);
  EXPECT_EQ(a["reproduced_segment_events"].get<uint64_t>(), 3u);
  EXPECT_EQ(a["recorded_segment_events"].get<uint64_t>(), 3u);
  r = run_expanse("replay '" + f + "' --compare");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("0 empty_cache() call(s), 1 free-and-retry(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 of 3 recorded segment events reproduced"), std::string::npos) << r.out;
}

// A recording made by the project's own model of PyTorch's allocator on a device of `capacity`
// bytes: random allocations and frees on two streams, with empty_cache() calls inserted at
// random. The model's own free-and-retries (a cudaMalloc over the capacity) and OOMs show in
// the recording as PyTorch's would; `stacks` marks empty_cache()'s segment frees as
// _record_memory_history(context="all") does.
struct Recording {
  std::string pickle;
  std::vector<Want> releases;  // what happened, in order
};

Recording record(uint32_t seed, uint64_t capacity, bool stacks,
                 const trace::TorchSettings& settings) {
  std::mt19937_64 rng(seed);
  TorchCachingModel m(settings, capacity);
  std::vector<SnapEvent> ev;
  std::vector<Want> happened;
  size_t seen = 0;
  uint64_t ops = 0;  // trace operations recorded so far
  // The model's segment events since the last call, as snapshot events; true if any was a free.
  // A segment's stream: the one its first allocation was on (the model reports none).
  std::map<uint64_t, uint64_t> segment_stream;
  auto take_events = [&](const std::string& frame, uint64_t stream) {
    bool freed = false;
    const auto& se = m.segment_events();
    for (; seen < se.size(); ++seen) {
      const bool is_free = se[seen].kind == TorchSegmentEvent::Kind::segment_free;
      freed = freed || is_free;
      if (!is_free) segment_stream[se[seen].addr] = stream;
      ev.push_back({replay::segment_event_name(se[seen].kind), se[seen].addr, se[seen].size,
                    segment_stream[se[seen].addr], is_free ? frame : ""});
    }
    return freed;
  };
  struct Live {
    uint64_t addr, size, stream;
  };
  std::map<uint32_t, Live> live;
  uint32_t next_id = 0;
  auto size_of = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0:
        return 1 + rng() % MiB;  // small pool
      case 1:
        return MiB + rng() % (9 * MiB);  // cut from 20 MiB segments
      default:
        return 10 * MiB + rng() % (70 * MiB);  // own segments
    }
  };
  for (int step = 0; step < 400; ++step) {
    const uint64_t r = rng() % 100;
    if (r < 6) {
      m.empty_cache();
      if (take_events(stacks ? "empty_cache" : "", 0)) happened.push_back({Kind::empty_cache, ops});
    } else if (r < 55 || live.empty()) {
      const uint32_t id = next_id++;
      const uint64_t size = size_of();
      const uint64_t stream = rng() % 2 == 0 ? 0 : 7;
      const bool ok = m.malloc(id, size, stream);
      if (take_events("", stream)) happened.push_back({Kind::free_and_retry, ops, !ok});
      if (ok) {
        live[id] = {*m.address_of(id), size, stream};
        ev.push_back({"alloc", live[id].addr, size, stream});
        ++ops;
      } else {
        ev.push_back({"oom", 0, size, stream});
      }
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      m.free(it->first);
      ev.push_back({"free_completed", it->second.addr, it->second.size, it->second.stream});
      live.erase(it);
      ++ops;
    }
  }
  // The end state: the segments still held, with the blocks still live.
  std::map<uint64_t, uint64_t> segs;
  for (const auto& e : ev) {
    if (e.action == "segment_alloc") segs[e.addr] = e.size;
    if (e.action == "segment_free") segs.erase(e.addr);
  }
  std::map<uint64_t, SnapSegment> end;
  for (const auto& [addr, size] : segs) end[addr] = {0, addr, size, {}};
  for (const auto& [id, l] : live) {
    auto s = std::prev(end.upper_bound(l.addr));
    s->second.blocks.push_back({l.addr, trace::torch_round_size(settings, l.size)});
  }
  std::vector<SnapSegment> segments;
  for (auto& [addr, s] : end) {
    std::sort(s.blocks.begin(), s.blocks.end(),
              [](const SnapBlock& a, const SnapBlock& b) { return a.address < b.address; });
    segments.push_back(s);
  }
  return {snapshot_pickle(segments, {ev}), happened};
}

// Every fourth seed with max_split_size (so a free-and-retry may release only oversize
// segments), half of them on a device small enough for free-and-retries and OOMs.
trace::TorchSettings settings_for(uint32_t seed) {
  trace::TorchSettings s;
  if (seed % 4 == 2) s.max_split_size = 24 * MiB;
  return s;
}
uint64_t capacity_for(uint32_t seed) { return seed % 2 == 0 ? 400 * MiB : uint64_t{1} << 50; }

// The recording, read as a snapshot with its allocator settings.
Trace load_recording(const Recording& rec, const trace::TorchSettings& s) {
  Trace t = load_snapshot("p.pickle", rec.pickle);
  t.torch->settings = s;
  trace::infer_releases(t);
  return t;
}

TEST(ReleaseInference, PropertyFindsTheModelsReleasesAndReplaysThem) {
  uint64_t empty_caches = 0, retries = 0, before_oom = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    const Recording rec = record(seed, capacity_for(seed), true, settings_for(seed));
    const Trace t = load_recording(rec, settings_for(seed));
    expect_releases(t, rec.releases);
    expect_reproduced(t);
    for (const Want& w : rec.releases) {
      ++(w.kind == Kind::empty_cache ? empty_caches : w.before_oom ? before_oom : retries);
    }
  }
  // The generated recordings hold every kind, many times.
  EXPECT_GT(empty_caches, 100u);
  EXPECT_GT(retries, 20u);
  EXPECT_GT(before_oom, 5u);
}

// The model's segment events at every operation, as a sorted list of (action, size), against
// the recording's: the same events, in whatever order.
void expect_same_events_per_op(const Trace& t) {
  const trace::TorchSettings s = t.torch->settings.value_or(trace::TorchSettings{});
  const auto start = replay::torch_start_state(t, s, nullptr);
  ASSERT_TRUE(start.has_value());
  replay::TorchRunOptions o;
  o.start = &*start;
  o.recorded_addresses = true;
  const replay::TorchRun run = replay::run_torch_model(t, s, o);
  std::map<uint64_t, std::vector<std::pair<std::string, uint64_t>>> want, got;
  for (const auto& e : t.torch->events) want[e.op].push_back({e.action, e.size});
  for (const auto& e : run.segment_events) {
    got[e.op].push_back({replay::segment_event_name(e.kind), e.size});
  }
  for (auto* m : {&want, &got}) {
    for (auto& [op, v] : *m) std::sort(v.begin(), v.end());
  }
  EXPECT_EQ(want, got);
  EXPECT_EQ(run.peak_reserved, t.torch_peak_reserved_bytes);
}

// Without recorded stacks an empty_cache() right before an allocation that the cache cannot
// serve and that grows the reserved memory to a new peak (or right before an OOM) reads as a
// free-and-retry; every release is still found at its place and every real free-and-retry as
// one. The replay makes the same segment events at every operation and the recorded peak; with
// max_split_size such a release frees the oversize segments first, so only the order within it
// may differ from the recording's.
TEST(ReleaseInference, PropertyWithoutStacks) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    const Recording rec = record(seed, capacity_for(seed), false, settings_for(seed));
    const Trace t = load_recording(rec, settings_for(seed));
    ASSERT_EQ(t.releases.size(), rec.releases.size());
    for (size_t i = 0; i < t.releases.size(); ++i) {
      EXPECT_EQ(t.releases[i].op, rec.releases[i].op);
      if (rec.releases[i].kind == Kind::free_and_retry) {
        EXPECT_EQ(t.releases[i].kind, Kind::free_and_retry);
      }
    }
    expect_same_events_per_op(t);
    if (settings_for(seed).max_split_size == trace::TorchSettings{}.max_split_size) {
      expect_reproduced(t);
    }
  }
}

}  // namespace
}  // namespace expanse::test
