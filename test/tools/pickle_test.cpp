// The pickle reader: CPython's own output (committed fixtures, protocols 2 to 5), and every way
// a pickle can be bad — each an error naming the byte offset, never a crash.
#include "trace/pickle_reader.hpp"
#include "tools_test_util.hpp"

#include <gtest/gtest.h>

#include <string>

namespace expanse::test {
namespace {

using trace::pickle::Document;
using trace::pickle::Kind;
using trace::pickle::Node;
using trace::pickle::parse;
using trace::pickle::parse_error;

const Node& at(const Document& d, const Node& dict, const char* key) {
  const Node* n = d.find(dict, key);
  EXPECT_NE(n, nullptr) << key;
  static const Node none;
  return n != nullptr ? *n : none;
}

// The byte offset an input makes parse() fail at; -1 if it parses.
int64_t fails_at(const std::string& data) {
  try {
    parse(data);
  } catch (const parse_error& e) {
    return static_cast<int64_t>(e.offset());
  }
  return -1;
}

std::string message_of(const std::string& data) {
  try {
    parse(data);
  } catch (const parse_error& e) {
    return e.what();
  }
  return "";
}

void check_values(const std::string& file, bool protocol5) {
  const std::string data = read_file(fixture(file));
  ASSERT_FALSE(data.empty()) << file;
  Document d = parse(data);
  const Node& root = d[d.root()];
  ASSERT_EQ(root.kind, Kind::dict);
  const Node& ints = at(d, root, "ints");
  ASSERT_EQ(ints.kind, Kind::list);
  const int64_t want[] = {0,          1,           -1,          255,
                          256,        65535,       65536,       -(int64_t{1} << 31),
                          INT32_MAX,  int64_t{1} << 31,          (int64_t{1} << 47) + 5,
                          INT64_MIN,  INT64_MAX};
  ASSERT_EQ(ints.items.size(), std::size(want));
  for (size_t i = 0; i < std::size(want); ++i) {
    EXPECT_EQ(d[ints.items[i]].kind, Kind::integer) << i;
    EXPECT_EQ(d[ints.items[i]].integer, want[i]) << i;
  }
  EXPECT_EQ(at(d, root, "float").kind, Kind::floating);
  EXPECT_EQ(at(d, root, "float").floating, 1.5);
  EXPECT_EQ(at(d, root, "none").kind, Kind::none);
  EXPECT_EQ(at(d, root, "true").kind, Kind::boolean);
  EXPECT_EQ(at(d, root, "true").integer, 1);
  EXPECT_EQ(at(d, root, "false").integer, 0);
  EXPECT_EQ(at(d, root, "unicode").text, "h\xc3\xa9llo");
  const Node& tuple = at(d, root, "tuple");
  ASSERT_EQ(tuple.kind, Kind::tuple);
  ASSERT_EQ(tuple.items.size(), 3u);
  EXPECT_EQ(d[tuple.items[1]].kind, Kind::tuple);
  EXPECT_EQ(d[tuple.items[2]].items.size(), 0u);
  const Node& shared = at(d, root, "shared");
  ASSERT_EQ(shared.items.size(), 3u);
  EXPECT_EQ(shared.items[0], shared.items[2]);  // the memo gives the same object back
  EXPECT_EQ(at(d, root, "set").kind, Kind::set);
  ASSERT_EQ(at(d, root, "set").items.size(), 1u);
  EXPECT_EQ(d[at(d, root, "set").items[0]].integer, 7);
  EXPECT_EQ(at(d, root, "frozenset").kind, Kind::set);
  const Node& ordered = at(d, root, "ordered");
  ASSERT_EQ(ordered.kind, Kind::dict);  // collections.OrderedDict() + SETITEMS
  EXPECT_EQ(d.find(ordered, "k")->integer, 1);
  const Node& opaque = at(d, root, "opaque");
  ASSERT_EQ(opaque.kind, Kind::object);  // a class the reader does not know: opaque, not run
  EXPECT_EQ(d[opaque.items[0]].text, "__main__.Opaque");
  if (protocol5) {
    EXPECT_EQ(at(d, root, "bytes").kind, Kind::bytes);
    EXPECT_EQ(at(d, root, "bytes").text, std::string("\x00\x01", 2));
    EXPECT_EQ(at(d, root, "bytearray").text, "ab");
  }
}

TEST(Pickle, ReadsCPythonProtocol5) { check_values("values_p5.pickle", true); }
TEST(Pickle, ReadsCPythonProtocol2) { check_values("values_p2.pickle", false); }

TEST(Pickle, ReadsCPythonSnapshotsOfEveryProtocol) {
  for (int p = 2; p <= 5; ++p) {
    const std::string data = read_file(fixture("snapshot_p" + std::to_string(p) + ".pickle"));
    Document d = parse(data);
    const Node& root = d[d.root()];
    ASSERT_EQ(root.kind, Kind::dict) << p;
    const Node* traces = d.find(root, "device_traces");
    ASSERT_NE(traces, nullptr);
    ASSERT_EQ(traces->items.size(), 2u);
    EXPECT_EQ(d[traces->items[0]].items.size(), 9u);
  }
}

TEST(Pickle, WriterOutputRoundTrips) {
  PickleWriter w;
  w.empty_list().mark();
  for (int64_t v : {int64_t{0}, int64_t{-5}, int64_t{1} << 40, -(int64_t{1} << 40), INT64_MIN}) {
    w.integer(v);
  }
  w.str("a").str("a").appends().stop();
  Document d = parse(w.bytes());
  const Node& l = d[d.root()];
  ASSERT_EQ(l.items.size(), 7u);
  EXPECT_EQ(d[l.items[2]].integer, int64_t{1} << 40);
  EXPECT_EQ(d[l.items[3]].integer, -(int64_t{1} << 40));
  EXPECT_EQ(d[l.items[4]].integer, INT64_MIN);
  EXPECT_EQ(l.items[5], l.items[6]);
}

TEST(Pickle, EmptyAndNotAPickle) {
  EXPECT_EQ(fails_at(""), 0);
  EXPECT_NE(message_of("").find("empty"), std::string::npos);
  EXPECT_EQ(fails_at("Thread,Time"), 0);
  EXPECT_NE(message_of("Thread,Time").find("protocol 2 or later"), std::string::npos);
  EXPECT_EQ(fails_at(std::string("\x80\x01N.", 4)), 0);  // protocol 1 announced
  EXPECT_EQ(fails_at(std::string("\x80\x06N.", 4)), 0);  // protocol 6 does not exist
  EXPECT_NE(message_of(std::string("\x80\x06N.", 4)).find("protocol 6"), std::string::npos);
}

TEST(Pickle, EveryTruncationIsAnErrorWithinTheData) {
  const std::string data = read_file(fixture("snapshot_p4.pickle"));
  ASSERT_GT(data.size(), 100u);
  for (size_t n = 0; n < data.size(); ++n) {
    const int64_t off = fails_at(data.substr(0, n));
    ASSERT_GE(off, 0) << "prefix of " << n << " bytes parsed";
    EXPECT_LE(off, static_cast<int64_t>(n)) << n;
  }
}

TEST(Pickle, EverySingleByteCorruptionParsesOrFailsCleanly) {
  const std::string data = read_file(fixture("snapshot_p4.pickle"));
  for (size_t i = 0; i < data.size(); ++i) {
    for (int v : {0x00, 0x7f, 0xff, int{'('}, int{'.'}, int{'e'}, int{'u'}, int{'h'}}) {
      std::string bad = data;
      bad[i] = static_cast<char>(v);
      const int64_t off = fails_at(bad);
      EXPECT_LE(off, static_cast<int64_t>(bad.size())) << i;
    }
  }
}

TEST(Pickle, UnsupportedOpcodeNamesItAndItsOffset) {
  // PERSID ('P'): a persistent id, which snapshots never contain.
  const std::string data = std::string("\x80\x04", 2) + "P1\n.";
  EXPECT_EQ(fails_at(data), 2);
  const std::string m = message_of(data);
  EXPECT_NE(m.find("byte 2"), std::string::npos) << m;
  EXPECT_NE(m.find("'P'"), std::string::npos) << m;
  EXPECT_NE(m.find("unsupported"), std::string::npos) << m;
}

TEST(Pickle, ExtensionCodesAndBufferOpcodes) {
  auto p = [](const std::string& body) { return std::string("\x80\x05", 2) + body; };
  // EXT1 / EXT2 / EXT4 name a class by its copyreg code: opaque, as a global is.
  for (const std::string& ext : {std::string("\x82\x07", 2), std::string("\x83\x07\x00", 3),
                                 std::string("\x84\x07\x00\x00\x00", 5)}) {
    Document d = parse(p(ext + ")R."));  // ext() : an object of that class
    EXPECT_EQ(d[d.root()].kind, Kind::object);
    EXPECT_EQ(d[d[d.root()].items[0]].text, "extension 7");
  }
  // READONLY_BUFFER on an in-band bytearray changes nothing the reader keeps.
  Document d = parse(p(std::string("\x96\x02\0\0\0\0\0\0\0ab\x98.", 13)));
  EXPECT_EQ(d[d.root()].text, "ab");
  // NEXT_BUFFER needs a buffer that a file cannot hold.
  EXPECT_EQ(fails_at(p("\x97.")), 2);
  EXPECT_NE(message_of(p("\x97.")).find("out-of-band buffer"), std::string::npos);
  EXPECT_EQ(fails_at(p("\x98.")), 2);  // READONLY_BUFFER with nothing on the stack
}

TEST(Pickle, StructuralErrors) {
  auto p = [](const std::string& body) { return std::string("\x80\x04", 2) + body; };
  // BINGET of a memo key never PUT.
  EXPECT_NE(message_of(p(std::string("h\x05.", 3))).find("memo key 5"), std::string::npos);
  // APPENDS with no MARK.
  EXPECT_NE(message_of(p("]e.")).find("MARK"), std::string::npos);
  // Stack underflow.
  EXPECT_NE(message_of(p("a.")).find("underflow"), std::string::npos);
  // STOP with two values, and with none.
  EXPECT_NE(message_of(p("NN.")).find("2 values"), std::string::npos);
  EXPECT_NE(message_of(p(".")).find("0 values"), std::string::npos);
  // Trailing data after STOP.
  EXPECT_NE(message_of(p("N.xyz")).find("trailing"), std::string::npos);
  // SETITEMS on a list; APPENDS on a dict.
  EXPECT_NE(message_of(p("](Nu.")).find("SETITEMS on a list"), std::string::npos);
  EXPECT_NE(message_of(p("}(Ne.")).find("APPENDS on a dict"), std::string::npos);
  // A LONG4 whose length runs past the end.
  EXPECT_NE(message_of(p(std::string("\x8b\xff\xff\xff\x7f", 5))).find("truncated"),
            std::string::npos);
  // A string whose length runs past the end (no huge allocation first).
  EXPECT_NE(message_of(p(std::string("\x8d\xff\xff\xff\xff\xff\xff\xff\x0f", 9)))
                .find("truncated"),
            std::string::npos);
  // A frame longer than the data.
  EXPECT_NE(message_of(p(std::string("\x95\x00\x00\x00\x00\x01\x00\x00\x00N.", 11)))
                .find("truncated"),
            std::string::npos);
}

TEST(Pickle, DeepNestingDoesNotRecurse) {
  PickleWriter w;
  const int depth = 200000;
  for (int i = 0; i < depth; ++i) w.mark();
  w.empty_list();
  for (int i = 0; i < depth; ++i) w.op('l');  // LIST: wrap what is above the mark
  w.stop();
  // Each LIST pops to its MARK: [[[...[]...]]]
  Document d = parse(w.bytes());
  EXPECT_EQ(d[d.root()].kind, Kind::list);
}

}  // namespace
}  // namespace expanse::test
