// Helpers for the tools tests: a small pickle writer (protocol 4, the opcodes CPython's pickler
// emits for snapshots), a snapshot builder on top of it, temporary files, and running the
// expanse binary.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace expanse::test {

class PickleWriter {
 public:
  explicit PickleWriter(int proto = 4) {
    op(0x80);
    out_.push_back(static_cast<char>(proto));
  }

  PickleWriter& op(uint8_t o) {
    out_.push_back(static_cast<char>(o));
    return *this;
  }
  PickleWriter& raw(const std::string& s) {
    out_ += s;
    return *this;
  }
  PickleWriter& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }

  PickleWriter& none() { return op('N'); }
  PickleWriter& boolean(bool b) { return op(b ? 0x88 : 0x89); }
  PickleWriter& integer(int64_t v) {
    if (v >= 0 && v < 256) return op('K').le(static_cast<uint64_t>(v), 1);
    if (v >= 0 && v < 65536) return op('M').le(static_cast<uint64_t>(v), 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').le(static_cast<uint32_t>(v), 4);
    // LONG1, minimal two's complement, as CPython writes it.
    auto u = static_cast<uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const uint8_t top = static_cast<uint8_t>(u >> (8 * (n - 1)));
      const uint8_t next = static_cast<uint8_t>(u >> (8 * (n - 2)));
      if ((top == 0 && !(next & 0x80)) || (top == 0xff && (next & 0x80))) {
        --n;
      } else {
        break;
      }
    }
    return op(0x8a).le(static_cast<uint64_t>(n), 1).le(u, n);
  }
  // An unsigned value as CPython writes it: 2^63 and above take a 9-byte LONG1.
  PickleWriter& uinteger(uint64_t v) {
    if (v <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(v));
    return op(0x8a).le(9, 1).le(v, 8).le(0, 1);
  }
  // LONG4 with these little-endian two's-complement bytes (any width).
  PickleWriter& long4(const std::string& le_bytes) {
    op(0x8b).le(le_bytes.size(), 4);
    return raw(le_bytes);
  }
  PickleWriter& binfloat(double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    op('G');
    for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    return *this;
  }
  // Strings are memoized; a repeat is written as BINGET (as CPython does).
  PickleWriter& str(const std::string& s) {
    auto it = memo_.find(s);
    if (it != memo_.end()) {
      if (it->second < 256) return op('h').le(it->second, 1);
      return op('j').le(it->second, 4);
    }
    if (s.size() < 256) {
      op(0x8c).le(s.size(), 1);
    } else {
      op('X').le(s.size(), 4);
    }
    out_ += s;
    op(0x94);
    memo_[s] = next_memo_++;
    return *this;
  }
  PickleWriter& empty_dict() { return memoize(op('}')); }
  PickleWriter& empty_list() { return memoize(op(']')); }
  PickleWriter& mark() { return op('('); }
  PickleWriter& setitems() { return op('u'); }
  PickleWriter& appends() { return op('e'); }
  PickleWriter& stop() { return op('.'); }

  size_t offset() const { return out_.size(); }
  const std::string& bytes() const { return out_; }

 private:
  PickleWriter& memoize(PickleWriter& w) {
    ++next_memo_;
    return w.op(0x94);
  }
  std::string out_;
  std::map<std::string, uint64_t> memo_;
  uint64_t next_memo_ = 0;
};

struct SnapEvent {
  std::string action;
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t stream = 0;
  std::string frame = "";  // when set: 'frames' holds one frame of this name (a recorded stack)
};
struct SnapBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  std::string state = "active_allocated";
};
struct SnapSegment {
  int device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  std::vector<SnapBlock> blocks;
};

// {'segments': [...], 'device_traces': [[{action, addr, size, stream}, ...], ...]}
inline std::string snapshot_pickle(const std::vector<SnapSegment>& segments,
                                   const std::vector<std::vector<SnapEvent>>& traces) {
  PickleWriter w;
  w.empty_dict().mark();
  w.str("segments").empty_list();
  if (!segments.empty()) {
    w.mark();
    for (const SnapSegment& s : segments) {
      w.empty_dict().mark();
      w.str("device").integer(s.device);
      w.str("address").integer(static_cast<int64_t>(s.address));
      w.str("total_size").integer(static_cast<int64_t>(s.total_size));
      w.str("blocks").empty_list();
      if (!s.blocks.empty()) {
        w.mark();
        for (const SnapBlock& b : s.blocks) {
          w.empty_dict().mark();
          w.str("address").integer(static_cast<int64_t>(b.address));
          w.str("size").integer(static_cast<int64_t>(b.size));
          w.str("state").str(b.state);
          w.setitems();
        }
        w.appends();
      }
      w.setitems();
    }
    w.appends();
  }
  w.str("device_traces").empty_list();
  if (!traces.empty()) {
    w.mark();
    for (const auto& t : traces) {
      w.empty_list();
      if (t.empty()) continue;
      w.mark();
      for (const SnapEvent& e : t) {
        w.empty_dict().mark();
        w.str("action").str(e.action);
        w.str("addr").integer(static_cast<int64_t>(e.addr));
        w.str("size").integer(static_cast<int64_t>(e.size));
        w.str("stream").integer(static_cast<int64_t>(e.stream));
        if (!e.frame.empty()) {
          w.str("frames").empty_list().mark();
          w.empty_dict().mark();
          w.str("name").str(e.frame).str("filename").str("memory.py").str("line").integer(1);
          w.setitems().appends();
        }
        w.setitems();
      }
      w.appends();
    }
    w.appends();
  }
  w.setitems().stop();
  return w.bytes();
}

// A fresh directory for one test's files, removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "expanse_tools_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const char* p = mkdtemp(buf.data());
    EXPECT_NE(p, nullptr);
    path_ = p != nullptr ? p : "/tmp";
  }
  ~TempDir() {
    for (const auto& f : files_) std::remove(f.c_str());
    rmdir(path_.c_str());
  }
  std::string write(const std::string& name, const std::string& content) {
    std::string f = path_ + "/" + name;
    std::ofstream(f, std::ios::binary) << content;
    files_.push_back(f);
    return f;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string fixture(const std::string& name) {
  return std::string(EXPANSE_SOURCE_DIR) + "/test/tools/data/" + name;
}

struct RunResult {
  int status = -1;   // exit status, or -1 if it did not exit normally (signal)
  std::string out;   // stdout
  std::string err;   // stderr
};

// Runs build/bin/expanse with args (a shell-quoted string) and EXPANSE_CONF=driver:sim.
inline RunResult run_expanse(const std::string& args, const std::string& conf = "driver:sim") {
  static int counter = 0;
  const std::string base =
      ::testing::TempDir() + "expanse_cli_" + std::to_string(getpid()) + "_" +
      std::to_string(counter++);
  const std::string cmd = "EXPANSE_CONF='" + conf + "' '" + std::string(EXPANSE_BUILD_BIN_DIR) +
                          "/expanse' " + args + " >'" + base + ".out' 2>'" + base + ".err'";
  RunResult r;
  int st = std::system(cmd.c_str());
  r.status = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

}  // namespace expanse::test
