#include "trace/torch_settings.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace expanse::trace {
namespace {

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

int floor_log2(uint64_t v) {
  int n = -1;
  while (v != 0) {
    v >>= 1;
    ++n;
  }
  return n;
}

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("PyTorch allocator settings: " + what);
}

// PyTorch's lexer: ',', ':', '[' and ']' are tokens of their own; other characters form words.
std::vector<std::string> lex(std::string_view conf) {
  std::vector<std::string> out;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) out.push_back(word);
    word.clear();
  };
  for (char c : conf) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      flush();
      out.emplace_back(1, c);
    } else if (c != ' ' && c != '\t') {
      word += c;
    }
  }
  flush();
  return out;
}

class Tokens {
 public:
  explicit Tokens(std::vector<std::string> t) : t_(std::move(t)) {}
  bool done() const { return i_ >= t_.size(); }
  const std::string& peek() const {
    static const std::string end = "<end>";
    return done() ? end : t_[i_];
  }
  std::string next(const char* what) {
    if (done()) bad(std::string("expected ") + what + " at the end of the text");
    return t_[i_++];
  }
  void expect(const char* tok, const std::string& after) {
    std::string got = next(tok);
    if (got != tok)
      bad("expected '" + std::string(tok) + "' after '" + after + "', found '" + got + "'");
  }

 private:
  std::vector<std::string> t_;
  size_t i_ = 0;
};

uint64_t parse_uint(const std::string& key, const std::string& text) {
  if (text.empty() || text.size() > 19) bad(key + ": '" + text + "' is not a whole number");
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') bad(key + ": '" + text + "' is not a whole number");
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

double parse_double(const std::string& key, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) bad(key + ": '" + text + "' is not a number");
  return v;
}

bool parse_bool(const std::string& key, const std::string& text) {
  if (text == "True" || text == "true") return true;
  if (text == "False" || text == "false") return false;
  bad(key + ": expected True or False, found '" + text + "'");
}

void parse_roundup(Tokens& t, TorchSettings& s) {
  const std::string key = "roundup_power2_divisions";
  auto check = [&](uint64_t v) {
    if (v != 0 && !is_pow2(v)) bad(key + ": " + std::to_string(v) + " is not a power of 2");
    return v;
  };
  if (t.peek() != "[") {  // one value for every interval
    s.roundup_power2_divisions.fill(check(parse_uint(key, t.next("a value"))));
    return;
  }
  t.next("[");
  size_t last = 0;
  bool first = true;
  while (t.peek() != "]") {
    std::string bound = t.next("an interval");
    t.expect(":", bound);
    uint64_t div = check(parse_uint(key, t.next("a division count")));
    if (bound == ">") {
      for (size_t i = last; i < s.roundup_power2_divisions.size(); ++i) {
        s.roundup_power2_divisions[i] = div;
      }
    } else {
      uint64_t mb = parse_uint(key, bound);
      if (!is_pow2(mb)) bad(key + ": interval " + bound + " (MiB) is not a power of 2");
      size_t index = std::min<size_t>(static_cast<size_t>(floor_log2(mb)), kRoundupIntervals - 1);
      if (first) {
        for (size_t i = 0; i < index; ++i) s.roundup_power2_divisions[i] = div;
        first = false;
      }
      s.roundup_power2_divisions[index] = div;
      last = index;
    }
    if (t.peek() == ",") t.next(",");
  }
  t.next("]");
}

}  // namespace

uint64_t TorchSettings::divisions_for(uint64_t size) const noexcept {
  int log = floor_log2(size);
  int index = log > 20 ? log - 20 : 0;
  if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
  return roundup_power2_divisions[static_cast<size_t>(index)];
}

std::string TorchSettings::to_conf() const {
  std::string out;
  auto add = [&out](const std::string& kv) { out += (out.empty() ? "" : ",") + kv; };
  if (max_split_size != std::numeric_limits<uint64_t>::max()) {
    add("max_split_size_mb:" + std::to_string(max_split_size / kMiB));
  }
  if (max_non_split_rounding != kLargeBuffer) {
    add("max_non_split_rounding_mb:" + std::to_string(max_non_split_rounding / kMiB));
  }
  if (garbage_collection_threshold > 0) {
    add("garbage_collection_threshold:" + std::to_string(garbage_collection_threshold));
  }
  if (memory_fraction > 0) add("per_process_memory_fraction:" + std::to_string(memory_fraction));
  bool any = false;
  for (uint64_t d : roundup_power2_divisions) any = any || d != 0;
  if (any) {
    std::string list;
    for (size_t i = 0; i < roundup_power2_divisions.size(); ++i) {
      list += (i ? "," : "") + std::to_string(uint64_t{1} << i) + ":" +
              std::to_string(roundup_power2_divisions[i]);
    }
    add("roundup_power2_divisions:[" + list + "]");
  }
  if (expandable_segments) add("expandable_segments:True");
  return out;
}

TorchSettings parse_torch_conf(std::string_view conf) {
  TorchSettings s;
  Tokens t(lex(conf));
  while (!t.done()) {
    std::string key = t.next("a key");
    if (key == ",") continue;
    t.expect(":", key);
    if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
      uint64_t mb = parse_uint(key, t.next("a size in MiB"));
      // PyTorch raises anything below 20 MiB to 20 MiB (kLargeBuffer).
      uint64_t bytes = std::max(mb, kLargeBuffer / kMiB) * kMiB;
      (key == "max_split_size_mb" ? s.max_split_size : s.max_non_split_rounding) = bytes;
    } else if (key == "garbage_collection_threshold") {
      double v = parse_double(key, t.next("a fraction"));
      if (!(v > 0 && v < 1)) bad(key + ": " + std::to_string(v) + " is not in (0, 1)");
      s.garbage_collection_threshold = v;
    } else if (key == "per_process_memory_fraction") {
      double v = parse_double(key, t.next("a fraction"));
      if (!(v >= 0 && v <= 1)) bad(key + ": " + std::to_string(v) + " is not in [0, 1]");
      s.memory_fraction = v;
    } else if (key == "roundup_power2_divisions") {
      parse_roundup(t, s);
    } else if (key == "expandable_segments") {
      s.expandable_segments = parse_bool(key, t.next("True or False"));
    } else if (key == "backend") {
      std::string v = t.next("native or cudaMallocAsync");
      if (v != "native") {
        bad("backend:" + v + " is not modelled (only PyTorch's native caching allocator is)");
      }
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc" ||
               key == "pinned_use_cuda_host_register" || key == "pinned_use_hip_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads" ||
               key == "graph_capture_record_stream_reuse") {
      t.next("a value");  // no effect on the device allocator's placement decisions
    } else {
      bad("unknown key '" + key + "'");
    }
  }
  return s;
}

uint64_t torch_round_size(const TorchSettings& s, uint64_t size) noexcept {
  if (size < kMinBlockSize) return kMinBlockSize;
  const uint64_t divisions = s.divisions_for(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    if (is_pow2(size)) return size;
    const uint64_t floor = uint64_t{1} << floor_log2(size);
    const uint64_t step = floor >> floor_log2(divisions);
    if (step == 0) return floor << 1;
    const uint64_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

uint64_t torch_allocation_size(uint64_t rounded) noexcept {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

}  // namespace expanse::trace
