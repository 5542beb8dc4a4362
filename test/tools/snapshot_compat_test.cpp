// Snapshots as every PyTorch version since 2.1 writes them: ints of any width (a C++ frame's line
// number 2^64-1 is a 9-byte LONG1), events with or without frames / stream / time_us, OOM and
// user-defined events, segments with segment_type and frames in their blocks, blocks without an
// address (older versions), allocator_settings, several devices. A field replay does not need
// never makes a snapshot unreadable; one it needs is an error only when its value does not fit.
#include "trace/pickle_reader.hpp"
#include "replay/replay.hpp"
#include "trace/trace.hpp"
#include "tools_test_util.hpp"

#include "conf/env_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace expanse::test {
namespace {

using trace::input_error;
using trace::load_snapshot;
using trace::Trace;
namespace pickle = trace::pickle;

constexpr uint64_t kLineUnknown = UINT64_MAX;  // what PyTorch records for a frame with no line

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

// [{'name': ..., 'filename': ..., 'line': 2^64-1}]
void frames(PickleWriter& w) {
  w.empty_list().mark();
  w.empty_dict().mark().str("name").str("??").str("filename").str("??");
  w.str("line").uinteger(kLineUnknown).setitems();
  w.appends();
}

// An event dict with the keys given, written in PyTorch's order.
struct Ev {
  const char* action;
  uint64_t addr = 0;
  uint64_t size = 0;
  bool has_addr = true, has_size = true, has_stream = true, has_time = true, has_frames = true;
  int64_t stream = 0;
  bool oom = false;  // 'device_free' instead of 'addr'
};

void event(PickleWriter& w, const Ev& e) {
  w.empty_dict().mark().str("action").str(e.action);
  if (e.oom) w.str("device_free").integer(123);
  if (e.has_addr && !e.oom) w.str("addr").uinteger(e.addr);
  if (e.has_size) w.str("size").uinteger(e.size);
  if (e.has_stream) w.str("stream").integer(e.stream);
  if (e.has_time) w.str("time_us").uinteger(1700000000000000);
  if (e.has_frames) {
    w.str("frames");
    frames(w);
  }
  w.setitems();
}

struct Blk {
  uint64_t address;  // 0: no 'address' key (PyTorch before 2.1)
  uint64_t size;
  const char* state;
};

void segment(PickleWriter& w, int device, uint64_t address, uint64_t total,
             const std::vector<Blk>& blocks) {
  w.empty_dict().mark();
  w.str("device").integer(device).str("address").uinteger(address);
  w.str("total_size").uinteger(total).str("allocated_size").integer(0);
  w.str("active_size").integer(0).str("requested_size").integer(0);
  w.str("stream").integer(0).str("segment_type").str(total > (1u << 20) ? "large" : "small");
  w.str("segment_pool_id").integer(0).integer(0).op(0x86);  // TUPLE2
  w.str("is_expandable").boolean(false).str("frames");
  frames(w);
  w.str("blocks").empty_list().mark();
  for (const Blk& b : blocks) {
    w.empty_dict().mark();
    if (b.address != 0) w.str("address").uinteger(b.address);
    w.str("size").uinteger(b.size).str("requested_size").uinteger(b.size);
    w.str("state").str(b.state).str("frames");
    frames(w);
    w.setitems();
  }
  w.appends().setitems();
}

constexpr uint64_t M = 1 << 20;

// Device 0: a 2 MiB segment made during the trace (a block freed by its tensor but still waiting
// for its streams, allocated before recording) and one written without block addresses (its
// second block allocated before recording); device 1: one 20 MiB block.
std::string modern_snapshot() {
  PickleWriter w;
  w.empty_dict().mark();
  w.str("segments").empty_list().mark();
  segment(w, 0, 0x100000, 2 * M,
          {{0x100000, 0x400, "inactive"},
           {0x100400, 0x1000, "active_pending_free"},
           {0x101400, 2 * M - 0x1400, "inactive"}});
  segment(w, 0, 0x300000, 2 * M,
          {{0, 0xc00, "active_allocated"}, {0, 0x800, "active_allocated"},
           {0, 2 * M - 0x1400, "inactive"}});
  segment(w, 1, 0x5000000, 20 * M, {{0x5000000, 20 * M, "active_allocated"}});
  w.appends();

  w.str("device_traces").empty_list().mark();
  w.empty_list().mark();
  event(w, {"segment_alloc", 0x100000, 2 * M});
  Ev a1{"alloc", 0x100000, 1000};
  a1.stream = 5;
  event(w, a1);
  Ev a2{"alloc", 0x300000, 3000};
  a2.has_stream = a2.has_time = a2.has_frames = false;  // the oldest form
  event(w, a2);
  Ev oom{"oom", 0, uint64_t{1} << 40};
  oom.oom = true;
  event(w, oom);
  Ev user{"user_defined"};
  user.has_addr = user.has_size = user.has_stream = false;
  event(w, user);
  Ev fr{"free_requested", 0x100000, 1000};
  fr.stream = 5;
  event(w, fr);
  Ev fc{"free_completed", 0x100000, 1000};
  fc.stream = 5;
  event(w, fc);
  Ev neg{"alloc", 0x400000, 512};
  neg.stream = -1;  // a handle written as int64_t: any bit pattern names a stream
  event(w, neg);
  Ev negf{"free_completed", 0x400000, 512};
  negf.stream = -1;
  event(w, negf);
  event(w, {"snapshot", 0, 0});
  w.appends();
  w.empty_list().mark();
  event(w, {"alloc", 0x5000000, 20 * M});
  w.appends();
  w.appends();

  w.str("allocator_settings").empty_dict().mark();
  w.str("PYTORCH_CUDA_ALLOC_CONF").str("expandable_segments:False");
  w.str("max_split_size").integer(-1).str("garbage_collection_threshold").binfloat(0.0);
  w.str("expandable_segments").boolean(false).str("release_lock_on_cudamalloc").boolean(false);
  w.str("roundup_power2_divisions").empty_dict().mark().str("1").integer(0).str("2").integer(0);
  w.setitems();
  w.setitems();
  w.str("external_annotations").empty_list();
  w.setitems().stop();
  return w.bytes();
}

TEST(SnapshotCompat, FrameLineNumber2To64Minus1IsReadable) {
  // The regression: a 9-byte LONG1 anywhere made the whole snapshot unreadable.
  PickleWriter w;
  w.empty_dict().mark().str("segments").empty_list();
  w.str("device_traces").empty_list().mark().empty_list().mark();
  event(w, {"alloc", 0x1000, 100});
  w.appends().appends().setitems().stop();
  Trace t = load_snapshot("line.pickle", w.bytes());
  EXPECT_EQ(t.allocs, 1u);
  EXPECT_EQ(t.peak_live_bytes, 100u);
}

// The figures of modern_snapshot(), and of make_fixtures.py's variants(), written by CPython.
void check_modern(const std::string& name, const std::string& data) {
  SCOPED_TRACE(name);
  Trace t = load_snapshot(name, data);
  EXPECT_EQ(t.device, 0);  // 3 allocations against 1
  EXPECT_EQ(t.devices_with_events, 2);
  EXPECT_EQ(t.events, 10u);
  EXPECT_EQ(t.allocs, 3u);
  EXPECT_EQ(t.frees, 2u);
  // Allocated before recording and holding memory at the end: the pending free (0x1000) and the
  // second block of the segment written without addresses (0x800, at 0x300c00).
  EXPECT_EQ(t.preexisting, 2u);
  EXPECT_EQ(t.preexisting_bytes, 0x1800u);
  EXPECT_EQ(t.peak_live_bytes, 0x1800u + 1000u + 3000u);
  // 2 MiB reserved before recording, 4 MiB after the segment_alloc.
  ASSERT_TRUE(t.torch_peak_reserved_bytes.has_value());
  EXPECT_EQ(*t.torch_peak_reserved_bytes, 4 * M);
  std::vector<uint64_t> streams = t.streams;
  std::sort(streams.begin(), streams.end());
  EXPECT_EQ(streams, (std::vector<uint64_t>{0, 5, UINT64_MAX}));

  Trace d1 = load_snapshot(name, data, 1);
  EXPECT_EQ(d1.peak_live_bytes, 20 * M);
  EXPECT_EQ(*d1.torch_peak_reserved_bytes, 20 * M);
}

TEST(SnapshotCompat, EveryVersionsKeysAndStates) {
  check_modern("modern.pickle", modern_snapshot());
  check_modern("snapshot_variants.pickle", read_file(fixture("snapshot_variants.pickle")));
}

TEST(SnapshotCompat, ReplaysOnTheSim) {
  Trace t = load_snapshot("modern.pickle", modern_snapshot());
  const conf::Config conf = conf::parse_config("");
  replay::ReplayResult r = replay::replay_trace(t, conf, 1024 * M);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.ops_done, t.ops.size());
}

// A snapshot with one alloc whose size is written by `size` (and freed).
std::string one_alloc(const std::function<void(PickleWriter&)>& size) {
  PickleWriter w;
  w.empty_dict().mark().str("segments").empty_list();
  w.str("device_traces").empty_list().mark().empty_list().mark();
  w.empty_dict().mark().str("action").str("alloc").str("addr").integer(0x1000).str("size");
  size(w);
  w.setitems();
  w.appends().appends().setitems().stop();
  return w.bytes();
}

TEST(SnapshotCompat, ANeededFieldIsAnErrorOnlyWhenItDoesNotFit) {
  // 2^64 - 1 fits a uint64_t: read, and an OOM when replayed (no device holds it), no crash.
  Trace t = load_snapshot("max.pickle", one_alloc([](PickleWriter& w) { w.uinteger(UINT64_MAX); }));
  EXPECT_EQ(t.peak_live_bytes, UINT64_MAX);
  const conf::Config conf = conf::parse_config("");
  EXPECT_EQ(replay::replay_trace(t, conf, 64 * M).ooms, 1u);

  // 2^64 does not: the error names the record, the key and the value.
  const std::string m = error_of([] {
    load_snapshot("wide.pickle", one_alloc([](PickleWriter& w) {
                    w.long4(std::string("\0\0\0\0\0\0\0\0\x01", 9));
                  }));
  });
  EXPECT_NE(m.find("wide.pickle: byte "), std::string::npos) << m;
  EXPECT_NE(m.find("device_traces[0][0]['size']"), std::string::npos) << m;
  EXPECT_NE(m.find("does not fit in 64 bits"), std::string::npos) << m;

  // A negative size.
  EXPECT_NE(error_of([] {
              load_snapshot("neg.pickle", one_alloc([](PickleWriter& w) { w.integer(-8); }));
            }).find("negative value int -8"),
            std::string::npos);
}

TEST(SnapshotCompat, SumsPast64BitsAreErrorsNotWraparound) {
  auto two = [](const char* action, uint64_t size) {
    PickleWriter w;
    w.empty_dict().mark().str("segments").empty_list();
    w.str("device_traces").empty_list().mark().empty_list().mark();
    event(w, {action, 0x1000, size});
    event(w, {action, 0x2000, size});
    event(w, {"alloc", 0x3000, 8});
    w.appends().appends().setitems().stop();
    return w.bytes();
  };
  std::string m = error_of([&] { load_snapshot("l.pickle", two("alloc", uint64_t{1} << 63)); });
  EXPECT_NE(m.find("more than 2^64 bytes"), std::string::npos) << m;
  m = error_of(
      [&] { load_snapshot("s.pickle", two("segment_alloc", (uint64_t{1} << 62) * 3)); });
  EXPECT_NE(m.find("past 2^63 bytes"), std::string::npos) << m;
}

TEST(SnapshotCompat, PickleIntsOfAnyWidth) {
  auto parse_one = [](const std::string& body) {
    return pickle::parse(std::string("\x80\x04", 2) + body + ".");
  };
  auto root = [](const pickle::Document& d) -> const pickle::Node& { return d[d.root()]; };
  uint64_t u = 0;
  int64_t i = 0;

  // 2^64 - 1: LONG1 of 9 bytes.
  pickle::Document d = parse_one(std::string("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11));
  EXPECT_EQ(root(d).range, pickle::IntRange::uint64);
  ASSERT_TRUE(root(d).as_uint64(&u));
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_FALSE(root(d).as_int64(&i));
  EXPECT_EQ(d.describe(root(d)), "int 18446744073709551615");

  // -1 and 5 with redundant sign-extension bytes: plain int64 values.
  d = parse_one(std::string("\x8a\x0a") + std::string(10, '\xff'));
  ASSERT_TRUE(root(d).as_int64(&i));
  EXPECT_EQ(i, -1);
  EXPECT_FALSE(root(d).as_uint64(&u));
  d = parse_one(std::string("\x8b\x0c\x00\x00\x00\x05", 6) + std::string(11, '\0'));
  ASSERT_TRUE(root(d).as_uint64(&u));
  EXPECT_EQ(u, 5u);

  // Wider than 64 bits, either sign: kept, described, never a value.
  d = parse_one(std::string("\x8b\x14\x00\x00\x00", 5) + std::string(19, '\0') + "\x01");
  EXPECT_EQ(root(d).range, pickle::IntRange::wider);
  EXPECT_FALSE(root(d).as_uint64(&u));
  EXPECT_NE(d.describe(root(d)).find("wider than 64 bits (20 bytes, 0x01000000"),
            std::string::npos)
      << d.describe(root(d));
  d = parse_one(std::string("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff", 11));  // -2^63 - 1
  EXPECT_EQ(root(d).range, pickle::IntRange::wider);
  EXPECT_LT(root(d).integer, 0);
  EXPECT_FALSE(root(d).as_int64(&i));
  // -2^63 fits.
  d = parse_one(std::string("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff", 11));
  ASSERT_TRUE(root(d).as_int64(&i));
  EXPECT_EQ(i, INT64_MIN);
}

}  // namespace
}  // namespace expanse::test
