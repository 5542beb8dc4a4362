// Reading an RMM log CSV (Thread,Time,Action,Pointer,Size,Stream, as
// rmm::mr::logging_resource_adaptor writes it).
#include "trace/trace.hpp"

#include "trace/trace_builder.hpp"

#include <functional>
#include <string>
#include <vector>

namespace expanse::trace {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (true) {
    size_t c = line.find(',', pos);
    out.push_back(trim(line.substr(pos, c == std::string_view::npos ? line.npos : c - pos)));
    if (c == std::string_view::npos) break;
    pos = c + 1;
  }
  return out;
}

bool parse_hex(std::string_view s, uint64_t* out) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool parse_dec(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

}  // namespace

Trace load_rmm_csv(const std::string& path, std::string_view data) {
  Trace t;
  t.path = path;
  t.format = "rmm-csv";
  if (data.size() >= 3 && data.substr(0, 3) == "\xEF\xBB\xBF") data.remove_prefix(3);

  size_t pos = 0;
  uint64_t lineno = 0;
  auto next_line = [&](std::string_view* line) {
    if (pos >= data.size()) return false;
    size_t nl = data.find('\n', pos);
    if (nl == std::string_view::npos) nl = data.size();
    *line = data.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    return true;
  };
  auto fail = [&](const std::string& what) -> void {
    throw input_error(path + ":" + std::to_string(lineno) + ": " + what);
  };

  std::string_view line;
  if (!next_line(&line)) throw input_error(path + ": empty file: not an RMM log CSV");
  std::vector<std::string_view> header = split(line);
  int col_action = -1, col_pointer = -1, col_size = -1, col_stream = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "Action") col_action = static_cast<int>(i);
    if (header[i] == "Pointer") col_pointer = static_cast<int>(i);
    if (header[i] == "Size") col_size = static_cast<int>(i);
    if (header[i] == "Stream") col_stream = static_cast<int>(i);
  }
  if (col_action < 0 || col_pointer < 0 || col_size < 0) {
    std::string shown(line.substr(0, 80));
    fail("not an RMM log CSV header: expected Thread,Time,Action,Pointer,Size,Stream, found '" +
         shown + "'");
  }

  // Records are named by line: "line 17" in back-references, "path:17" as a message prefix.
  TraceBuilder b(t, false, [&path](const std::string& w) { return path + ":" + w.substr(5); });
  std::function<std::string()> where_fn = [&] { return "line " + std::to_string(lineno); };
  while (next_line(&line)) {
    if (trim(line).empty()) continue;
    ++t.events;
    std::vector<std::string_view> f = split(line);
    if (f.size() != header.size()) {
      fail("expected " + std::to_string(header.size()) + " comma-separated fields, found " +
           std::to_string(f.size()));
    }
    std::string_view action = f[static_cast<size_t>(col_action)];
    uint64_t ptr = 0, size = 0, stream = 0;
    if (!parse_hex(f[static_cast<size_t>(col_pointer)], &ptr)) {
      fail("pointer '" + std::string(f[static_cast<size_t>(col_pointer)]) +
           "' is not a hexadecimal address");
    }
    if (!parse_dec(f[static_cast<size_t>(col_size)], &size)) {
      fail("size '" + std::string(f[static_cast<size_t>(col_size)]) +
           "' is not a byte count");
    }
    if (col_stream >= 0) {
      std::string_view s = f[static_cast<size_t>(col_stream)];
      bool ok = (s.size() > 1 && (s[1] == 'x' || s[1] == 'X')) ? parse_hex(s, &stream)
                                                               : parse_dec(s, &stream);
      if (!ok) fail("stream '" + std::string(s) + "' is neither hexadecimal (0x...) nor decimal");
    }
    if (action == "allocate") {
      if (size == 0) continue;  // a zero-byte allocation: nothing to replay
      if (ptr == 0) fail("allocation of " + std::to_string(size) + " bytes at a null pointer");
      b.alloc(ptr, size, stream, where_fn);
    } else if (action == "free" || action == "deallocate") {
      if (ptr == 0) continue;  // freeing nullptr is a no-op
      b.free(ptr, size, stream, where_fn);
    } else if (action == "allocate failure") {
      ++t.failed_allocs;
    } else {
      fail("unknown action '" + std::string(action) +
           "' (expected allocate, free, deallocate or allocate failure)");
    }
  }
  if (t.allocs == 0) {
    throw input_error(path + ": the log records no allocations");
  }
  b.finish();
  return t;
}

}  // namespace expanse::trace
