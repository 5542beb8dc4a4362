// Reading traces: PyTorch snapshots (peak live with blocks from before recording, PyTorch's
// reserved memory from its segments) and RMM log CSVs, and every bad input naming where it is.
#include "trace/trace.hpp"
#include "tools_test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace expanse::test {
namespace {

using trace::input_error;
using trace::load_rmm_csv;
using trace::load_snapshot;
using trace::load_trace;
using trace::Trace;
using trace::TraceOp;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

// The fixture written by CPython (make_fixtures.py): figures worked out by hand there.
TEST(Snapshot, CPythonFixtureFigures) {
  for (int p = 2; p <= 5; ++p) {
    const std::string f = fixture("snapshot_p" + std::to_string(p) + ".pickle");
    Trace t = load_trace(f);
    EXPECT_EQ(t.format, "pytorch-snapshot");
    EXPECT_EQ(t.device, 0);
    EXPECT_EQ(t.events, 9u);
    EXPECT_EQ(t.allocs, 3u);
    EXPECT_EQ(t.frees, 3u);
    EXPECT_EQ(t.preexisting, 2u);  // freed without an alloc; live at the end without one
    EXPECT_EQ(t.preexisting_bytes, 0x1800u + 0x800u);
    EXPECT_EQ(t.peak_live_bytes, 0x1000u + 4000u + 0x3000u + 0x800u);
    ASSERT_TRUE(t.torch_peak_reserved_bytes.has_value());
    EXPECT_EQ(*t.torch_peak_reserved_bytes, 0x8000u + 0x4000u);
    ASSERT_EQ(t.streams.size(), 2u);
    EXPECT_EQ(t.streams[0], 0u);
    EXPECT_EQ(t.streams[1], 77u);
    // Blocks from before recording come first.
    ASSERT_GE(t.ops.size(), 2u);
    EXPECT_EQ(t.ops[0].type, TraceOp::Type::alloc);
    EXPECT_EQ(t.ops[0].size, 0x1800u);
    EXPECT_EQ(t.ops[1].size, 0x800u);
    EXPECT_EQ(t.ops.size(), 2u + 3u + 3u);
  }
}

TEST(Snapshot, ReservedFollowsSegmentEvents) {
  // 1 MiB reserved before recording; +4 MiB, -2 MiB, +1 MiB: peak 5 MiB, end 4 MiB.
  const uint64_t M = 1 << 20;
  std::vector<SnapSegment> segs = {{0, 0x100000, 1 * M, {}}, {0, 0x600000, 2 * M, {}},
                                   {0, 0x900000, 1 * M, {}}, {1, 0xf00000, 64 * M, {}}};
  std::vector<SnapEvent> ev = {{"segment_alloc", 0x200000, 4 * M},
                               {"alloc", 0x200000, 100},
                               {"segment_free", 0x200000, 2 * M},
                               {"free_completed", 0x200000, 100},
                               {"segment_alloc", 0x900000, 1 * M}};
  Trace t = load_snapshot("s.pickle", snapshot_pickle(segs, {ev}));
  EXPECT_EQ(*t.torch_peak_reserved_bytes, 5 * M);
  EXPECT_EQ(t.peak_live_bytes, 100u);
}

// active_pending_free: freed by its tensor (free_requested), not back yet (no free_completed).
// PyTorch's own: the block holds memory to the end, whether its alloc was recorded (0x1000) or
// not (0x2000). One whose free_completed the trace records came back there, whatever the end
// state says (a writer that completes every free at once yet shows the block pending): it holds
// nothing at the end, allocated in the trace (0x4000) or before it (0x3000, freed in it).
TEST(Snapshot, APendingFreeHoldsMemoryUnlessTheTraceCompletedIt) {
  const uint64_t M = 1 << 20;
  const uint64_t A = 0x10000000;
  std::vector<SnapSegment> segs = {{0, A, 2 * M,
                                    {{A, 0x1000, "inactive"},
                                     {A + 0x1000, 0x1000, "active_pending_free"},
                                     {A + 0x2000, 0x1000, "active_pending_free"},
                                     {A + 0x3000, 0x1000, "active_pending_free"},
                                     {A + 0x4000, 0x1000, "active_pending_free"},
                                     {A + 0x5000, 2 * M - 0x5000, "inactive"}}}};
  std::vector<SnapEvent> ev = {{"alloc", A + 0x1000, 0x1000},
                               {"alloc", A + 0x4000, 0x1000},
                               {"free_requested", A + 0x1000, 0x1000},
                               {"free_requested", A + 0x2000, 0x1000},
                               {"free_requested", A + 0x3000, 0x1000},
                               {"free_completed", A + 0x3000, 0x1000},
                               {"free_requested", A + 0x4000, 0x1000},
                               {"free_completed", A + 0x4000, 0x1000}};
  Trace t = load_snapshot("s.pickle", snapshot_pickle(segs, {ev}));
  ASSERT_TRUE(t.torch.has_value());
  std::vector<std::pair<uint64_t, bool>> pre;
  for (const auto& p : t.torch->preexisting) pre.emplace_back(p.addr, p.live_at_end);
  std::sort(pre.begin(), pre.end());
  EXPECT_EQ(pre, (std::vector<std::pair<uint64_t, bool>>{{A + 0x2000, true}, {A + 0x3000, false}}));
  EXPECT_EQ(t.preexisting_bytes, 0x2000u);
  EXPECT_EQ(t.peak_live_bytes, 0x4000u);    // 0x1000 to 0x4000 at once, after the allocs
  EXPECT_EQ(t.live_at_end_bytes, 0x2000u);  // 0x1000 and 0x2000
}

TEST(Snapshot, ChoosesTheDeviceWithMostAllocations) {
  std::vector<SnapEvent> d0 = {{"alloc", 0x1000, 10}};
  std::vector<SnapEvent> d1 = {{"alloc", 0x1000, 20}, {"alloc", 0x2000, 30}};
  const std::string data = snapshot_pickle({}, {d0, d1});
  EXPECT_EQ(load_snapshot("s", data).device, 1);
  EXPECT_EQ(load_snapshot("s", data).peak_live_bytes, 50u);
  EXPECT_EQ(load_snapshot("s", data, 0).peak_live_bytes, 10u);
  EXPECT_NE(error_of([&] { load_snapshot("s", data, 2); }).find("2 device(s)"),
            std::string::npos);
}

TEST(Snapshot, NotASnapshot) {
  PickleWriter list;
  list.empty_list().stop();
  std::string m = error_of([&] { load_snapshot("l.pickle", list.bytes()); });
  EXPECT_NE(m.find("l.pickle: byte 2"), std::string::npos) << m;
  EXPECT_NE(m.find("not a PyTorch memory snapshot"), std::string::npos) << m;

  PickleWriter dict;
  dict.empty_dict().mark().str("segments").empty_list().setitems().stop();
  m = error_of([&] { load_snapshot("d.pickle", dict.bytes()); });
  EXPECT_NE(m.find("no 'device_traces'"), std::string::npos) << m;

  m = error_of([&] { load_snapshot("e.pickle", snapshot_pickle({}, {{}})); });
  EXPECT_NE(m.find("records no allocations"), std::string::npos) << m;
}

TEST(Snapshot, BadRecordsNameByteAndRecord) {
  // An event without 'size'.
  PickleWriter w;
  w.empty_dict().mark();
  w.str("segments").empty_list();
  w.str("device_traces").empty_list().mark().empty_list().mark();
  w.empty_dict().mark().str("action").str("alloc").str("addr").integer(4096).str("size").integer(
      8);
  w.setitems();
  const size_t second = w.offset();
  w.empty_dict().mark().str("action").str("alloc").str("addr").integer(8192);
  w.setitems().appends().appends().setitems().stop();
  std::string m = error_of([&] { load_snapshot("m.pickle", w.bytes()); });
  EXPECT_NE(m.find("m.pickle: byte " + std::to_string(second)), std::string::npos) << m;
  EXPECT_NE(m.find("device_traces[0][1]"), std::string::npos) << m;
  EXPECT_NE(m.find("missing key 'size'"), std::string::npos) << m;

  // A size that is a str.
  PickleWriter s;
  s.empty_dict().mark().str("segments").empty_list();
  s.str("device_traces").empty_list().mark().empty_list().mark();
  s.empty_dict().mark().str("action").str("alloc").str("addr").integer(4096).str("size").str("8");
  s.setitems().appends().appends().setitems().stop();
  m = error_of([&] { load_snapshot("t.pickle", s.bytes()); });
  EXPECT_NE(m.find("device_traces[0][0]['size']"), std::string::npos) << m;
  EXPECT_NE(m.find("expected an int, found str '8'"), std::string::npos) << m;
}

TEST(Snapshot, InconsistentTracesAreErrors) {
  std::string m = error_of([&] {
    load_snapshot("x.pickle", snapshot_pickle({}, {{{"alloc", 0x1000, 10},
                                                    {"free_completed", 0x1000, 10},
                                                    {"free_completed", 0x1000, 10}}}));
  });
  EXPECT_NE(m.find("x.pickle: byte "), std::string::npos) << m;
  EXPECT_NE(m.find("device_traces[0][2]"), std::string::npos) << m;
  EXPECT_NE(m.find("double free"), std::string::npos) << m;

  m = error_of([&] {
    load_snapshot("y.pickle",
                  snapshot_pickle({}, {{{"alloc", 0x1000, 10}, {"alloc", 0x1000, 10}}}));
  });
  EXPECT_NE(m.find("device_traces[0][1]"), std::string::npos) << m;
  EXPECT_NE(m.find("still live"), std::string::npos) << m;

  m = error_of([&] {
    load_snapshot("z.pickle",
                  snapshot_pickle({}, {{{"alloc", 0x1000, 10}, {"free_completed", 0x1000, 11}}}));
  });
  EXPECT_NE(m.find("allocated with size 10"), std::string::npos) << m;
}

TEST(Snapshot, TruncatedAndCorruptNameTheFileAndByte) {
  const std::string good = read_file(fixture("snapshot_p4.pickle"));
  std::string m = error_of([&] { load_snapshot("cut.pickle", good.substr(0, 300)); });
  EXPECT_NE(m.find("cut.pickle: byte "), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  std::string bad = good;
  ASSERT_EQ(static_cast<uint8_t>(bad[2]), 0x95);  // FRAME, right after PROTO 4
  bad[2] = '\xff';
  m = error_of([&] { load_snapshot("bad.pickle", bad); });
  EXPECT_NE(m.find("bad.pickle: byte 2: unsupported pickle opcode 0xff"), std::string::npos)
      << m;
}

const char* kHeader = "Thread,Time,Action,Pointer,Size,Stream\n";

TEST(RmmCsv, PeakStreamsAndSkippedRows) {
  std::string csv = std::string(kHeader) +
                    "1,08:29:32:000001,allocate,0x7f0000000000,1000,0x0\n"
                    "1,08:29:32:000002,allocate,0x7f0000100000,3000,0x7f00aa\r\n"
                    "1,08:29:32:000003,allocate failure,0x0,99999999,0x0\n"
                    "2,08:29:32:000004,free,0x7f0000000000,1000,0x7f00aa\n"
                    "\n"
                    "2,1634567890.5,allocate,7f0000200000,500,0x0\n"
                    "2,1634567890.6,deallocate,0x7f0000200000,500,0x0\n"
                    "2,1634567890.7,deallocate,0x7f0000100000,3000,0x7f00aa\n";
  Trace t = load_rmm_csv("log.csv", csv);
  EXPECT_EQ(t.format, "rmm-csv");
  EXPECT_EQ(t.events, 7u);
  EXPECT_EQ(t.allocs, 3u);
  EXPECT_EQ(t.frees, 3u);
  EXPECT_EQ(t.failed_allocs, 1u);
  EXPECT_EQ(t.peak_live_bytes, 4000u);
  EXPECT_EQ(t.live_at_end_bytes, 0u);
  ASSERT_EQ(t.streams.size(), 2u);
  EXPECT_EQ(t.streams[1], 0x7f00aau);
}

TEST(RmmCsv, BadInputNamesFileAndLine) {
  auto err = [](const std::string& body) {
    return error_of([&] { load_rmm_csv("log.csv", std::string(kHeader) + body); });
  };
  std::string m = err("1,t,allocate,0x1000,10,0x0\n1,t,allocate,0x2000\n");
  EXPECT_NE(m.find("log.csv:3: expected 6 comma-separated fields, found 4"), std::string::npos)
      << m;
  m = err("1,t,allocate,0x1000,10,0x0\n1,t,free,0x3000,10,0x0\n");
  EXPECT_NE(m.find("log.csv:3: free of 0x3000, which was never allocated"), std::string::npos)
      << m;
  m = err("1,t,allocate,0x1000,10,0x0\n1,t,free,0x1000,10,0x0\n1,t,free,0x1000,10,0x0\n");
  EXPECT_NE(m.find("log.csv:4: free of 0x1000, which was already freed at line 3"),
            std::string::npos)
      << m;
  m = err("1,t,allocate,0x1000,10,0x0\n1,t,allocate,0x1000,10,0x0\n");
  EXPECT_NE(m.find("log.csv:3: allocation at 0x1000, which is still live (allocated at line 2"),
            std::string::npos)
      << m;
  m = err("1,t,allocate,0x1000,10,0x0\n1,t,free,0x1000,12,0x0\n");
  EXPECT_NE(m.find("log.csv:3: free of 0x1000 with size 12, but it was allocated with size 10 "
                   "at line 2"),
            std::string::npos)
      << m;
  m = err("1,t,allocate,0xZZ,10,0x0\n");
  EXPECT_NE(m.find("log.csv:2: pointer '0xZZ'"), std::string::npos) << m;
  m = err("1,t,allocate,0x1000,-3,0x0\n");
  EXPECT_NE(m.find("log.csv:2: size '-3'"), std::string::npos) << m;
  m = err("1,t,allocate,0x1000,99999999999999999999999,0x0\n");
  EXPECT_NE(m.find("log.csv:2: size"), std::string::npos) << m;
  m = err("1,t,reallocate,0x1000,10,0x0\n");
  EXPECT_NE(m.find("log.csv:2: unknown action 'reallocate'"), std::string::npos) << m;
  m = err("1,t,allocate,0x1000,10,stream7\n");
  EXPECT_NE(m.find("log.csv:2: stream 'stream7'"), std::string::npos) << m;
  m = err("");
  EXPECT_NE(m.find("records no allocations"), std::string::npos) << m;

  m = error_of([] { load_rmm_csv("h.csv", "a,b,c\n1,2,3\n"); });
  EXPECT_NE(m.find("h.csv:1: not an RMM log CSV header"), std::string::npos) << m;
}

TEST(LoadTrace, ChoosesTheFormatFromTheContent) {
  TempDir dir;
  const std::string csv =
      dir.write("log.txt", std::string(kHeader) + "1,t,allocate,0x1000,10,0x0\n");
  EXPECT_EQ(load_trace(csv).format, "rmm-csv");
  const std::string snap =
      dir.write("snap.bin", snapshot_pickle({}, {{{"alloc", 0x1000, 10}}}));
  EXPECT_EQ(load_trace(snap).format, "pytorch-snapshot");
  const std::string junk = dir.write("junk.bin", "hello\n");
  std::string m = error_of([&] { load_trace(junk); });
  EXPECT_NE(m.find("junk.bin: byte 0: neither"), std::string::npos) << m;
  m = error_of([&] { load_trace(dir.path() + "/missing.csv"); });
  EXPECT_NE(m.find("missing.csv: cannot open"), std::string::npos) << m;
  const std::string empty = dir.write("empty.pickle", "");
  m = error_of([&] { load_trace(empty); });
  EXPECT_NE(m.find("empty.pickle: empty file"), std::string::npos) << m;
}

}  // namespace
}  // namespace expanse::test
