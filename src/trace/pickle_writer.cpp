#include "trace/pickle_writer.hpp"

#include "trace/pickle_opcodes.hpp"

#include <cstring>
#include <stdexcept>

namespace expanse::trace::pickle {
namespace {

constexpr size_t kBatch = 1000;

}  // namespace

Writer::Writer() {
  op(PROTO);
  op(2);
}

void Writer::le(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void Writer::value_done() {
  if (levels_.empty() || !levels_.back().list) return;
  if (++levels_.back().pending == kBatch) {
    op(APPENDS);
    op(MARK);
    levels_.back().pending = 0;
  }
}

void Writer::none() {
  op(NONE);
  value_done();
}

void Writer::boolean(bool v) {
  op(v ? NEWTRUE : NEWFALSE);
  value_done();
}

void Writer::integer(int64_t v) {
  if (v >= 0 && v < 0x100) {
    op(BININT1);
    le(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 0x10000) {
    op(BININT2);
    le(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(BININT);
    le(static_cast<uint64_t>(v), 4);
  } else {
    // Little-endian two's complement, as few bytes as keep the sign (Python's encode_long).
    const auto u = static_cast<uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const uint64_t top = (u >> (8 * (n - 1))) & 0xff;
      const uint64_t next_sign = (u >> (8 * (n - 1) - 1)) & 1;
      if ((top == 0 && next_sign == 0) || (top == 0xff && next_sign == 1)) {
        --n;
      } else {
        break;
      }
    }
    op(LONG1);
    out_.push_back(static_cast<char>(n));
    le(u, n);
  }
  value_done();
}

void Writer::floating(double v) {
  uint64_t bits = 0;
  static_assert(sizeof bits == sizeof v);
  std::memcpy(&bits, &v, sizeof bits);
  op(BINFLOAT);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  value_done();
}

void Writer::str(std::string_view s) {
  if (s.size() > UINT32_MAX) throw std::length_error("pickle: string longer than 4 GiB");
  op(BINUNICODE);
  le(s.size(), 4);
  out_.append(s.data(), s.size());
  value_done();
}

void Writer::open(uint8_t empty, bool list) {
  op(empty);
  op(MARK);
  levels_.push_back({list, 0});
}

void Writer::close(uint8_t add_items) {
  op(add_items);
  levels_.pop_back();
  value_done();
}

void Writer::begin_dict() { open(EMPTY_DICT, false); }
void Writer::end_dict() { close(SETITEMS); }
void Writer::begin_list() { open(EMPTY_LIST, true); }
void Writer::end_list() { close(APPENDS); }

void Writer::int_pair(int64_t a, int64_t b) {
  levels_.push_back({false, 0});  // the two items are not list items
  integer(a);
  integer(b);
  levels_.pop_back();
  op(TUPLE2);
  value_done();
}

std::string Writer::finish() {
  if (!levels_.empty()) throw std::logic_error("pickle: unclosed container");
  op(STOP);
  return std::move(out_);
}

}  // namespace expanse::trace::pickle
