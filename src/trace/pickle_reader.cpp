#include "trace/pickle_reader.hpp"

#include "trace/pickle_opcodes.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace expanse::trace::pickle {
namespace {

constexpr NodeId kNoNode = UINT32_MAX;
// CPython numbers memo entries 0, 1, 2, ... and each takes at least one byte to make, so a pickle
// of n bytes needs no index beyond n; the floor leaves room for hand-made pickles.
constexpr uint64_t kMinMemoLimit = uint64_t{1} << 16;

std::string opcode_text(uint8_t op) {
  char buf[40];
  if (op >= 0x20 && op < 0x7f) {
    std::snprintf(buf, sizeof buf, "'%c' (0x%02x)", op, op);
  } else {
    std::snprintf(buf, sizeof buf, "0x%02x", op);
  }
  return buf;
}

class Machine {
 public:
  Machine(std::string_view data, std::vector<Node>& nodes) : d_(data), nodes_(nodes) {}

  NodeId run() {
    if (d_.empty()) throw parse_error(0, "empty file: not a pickle");
    if (static_cast<uint8_t>(d_[0]) != PROTO) {
      throw parse_error(0, "not a pickle of protocol 2 or later (first byte " +
                               opcode_text(static_cast<uint8_t>(d_[0])) + ", expected 0x80)");
    }
    while (true) {
      if (pos_ >= d_.size()) {
        throw parse_error(pos_, "truncated: the data ends at byte " + std::to_string(d_.size()) +
                                    " before the STOP opcode");
      }
      op_at_ = pos_;
      const uint8_t op = u8();
      if (op == STOP) {
        if (!marks_.empty()) fail("STOP inside an unclosed MARK");
        if (stack_.size() != 1) {
          fail("STOP with " + std::to_string(stack_.size()) + " values on the stack, expected 1");
        }
        if (pos_ != d_.size()) {
          throw parse_error(pos_, std::to_string(d_.size() - pos_) +
                                      " bytes of trailing data after the STOP opcode");
        }
        return stack_.back();
      }
      step(op);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw parse_error(op_at_, what); }

  void need(uint64_t n) const {
    if (n > d_.size() - pos_) {
      fail("truncated: opcode " + opcode_text(static_cast<uint8_t>(d_[op_at_])) + " needs " +
           std::to_string(n) + " more bytes at byte " + std::to_string(pos_) +
           ", but the data ends at byte " + std::to_string(d_.size()));
    }
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(d_[pos_++]);
  }
  uint64_t le(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(d_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }
  std::string_view take(uint64_t n) {
    need(n);
    std::string_view s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view line() {
    size_t nl = d_.find('\n', pos_);
    if (nl == std::string_view::npos) fail("truncated: no end of line for a text argument");
    std::string_view s = d_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }

  NodeId make(Kind k) {
    if (nodes_.size() >= kNoNode - 1) fail("too many values");
    Node n;
    n.kind = k;
    n.offset = op_at_;
    nodes_.push_back(std::move(n));
    return static_cast<NodeId>(nodes_.size() - 1);
  }
  NodeId make_int(int64_t v, Kind k = Kind::integer) {
    NodeId id = make(k);
    nodes_[id].integer = v;
    return id;
  }
  NodeId make_text(Kind k, std::string_view s) {
    NodeId id = make(k);
    nodes_[id].text.assign(s.data(), s.size());
    return id;
  }

  void push(NodeId id) { stack_.push_back(id); }
  NodeId pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    NodeId id = stack_.back();
    stack_.pop_back();
    return id;
  }
  NodeId& top() {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Pops everything down to the last MARK (and the mark).
  std::vector<NodeId> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<NodeId> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }

  void memo_put(uint64_t index) {
    if (index >= std::max<uint64_t>(kMinMemoLimit, d_.size())) {
      fail("memo index " + std::to_string(index) + " is larger than a pickle of " +
           std::to_string(d_.size()) + " bytes can need");
    }
    if (index >= memo_.size()) memo_.resize(index + 1, kNoNode);
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    if (index >= memo_.size() || memo_[index] == kNoNode) {
      fail("memo key " + std::to_string(index) + " is not defined");
    }
    push(memo_[index]);
  }

  // LONG1 / LONG4: little-endian two's complement of any width.
  NodeId make_long(std::string_view b) {
    auto byte = [&](size_t i) { return static_cast<uint8_t>(b[i]); };
    size_t n = b.size();
    if (n == 0) return make_int(0);
    const bool negative = (byte(n - 1) & 0x80) != 0;
    const uint8_t ext = negative ? 0xff : 0x00;
    // Drop sign-extension bytes that do not change the value (CPython writes none, others may).
    while (n > 1 && byte(n - 1) == ext && ((byte(n - 2) & 0x80) != 0) == negative) --n;
    if (n <= 8 || (n == 9 && byte(8) == 0)) {  // (n == 9: 2^63 <= value < 2^64)
      uint64_t v = 0;
      for (size_t i = 0; i < n && i < 8; ++i) v |= uint64_t{byte(i)} << (8 * i);
      if (negative && n < 8) v |= ~uint64_t{0} << (8 * n);
      int64_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      NodeId id = make_int(bits);
      if (n == 9) nodes_[id].range = IntRange::uint64;
      return id;
    }
    NodeId id = make_int(negative ? -1 : 1);
    nodes_[id].range = IntRange::wider;
    std::string& hex = nodes_[id].text;  // for messages; long ones cut short
    static const char digits[] = "0123456789abcdef";
    hex = std::to_string(n) + " bytes, 0x";
    for (size_t i = n; i-- > 0 && hex.size() < 34;) {
      hex += digits[byte(i) >> 4];
      hex += digits[byte(i) & 15];
    }
    if (n > 16) hex += "...";
    return id;
  }

  Node& container(NodeId id, Kind k, const char* opname) {
    Node& n = nodes_[id];
    if (n.kind != k && n.kind != Kind::object) {
      fail(std::string(opname) + " on a " + kind_name(n.kind) + ", expected a " + kind_name(k));
    }
    return n;
  }

  void add_items(NodeId target, const std::vector<NodeId>& items, Kind k, const char* opname) {
    Node& n = container(target, k, opname);
    if (n.kind == Kind::object) return;  // opaque: its contents are not needed
    if (k == Kind::dict && items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
    n.items.insert(n.items.end(), items.begin(), items.end());
  }

  NodeId make_seq(Kind k, std::vector<NodeId> items) {
    NodeId id = make(k);
    nodes_[id].items = std::move(items);
    return id;
  }

  NodeId reduce(NodeId callable, NodeId args) {
    const Node& c = nodes_[callable];
    const Node& a = nodes_[args];
    if (c.kind == Kind::global && c.text == "collections.OrderedDict" && a.kind == Kind::tuple &&
        a.items.empty()) {
      return make(Kind::dict);
    }
    const bool set_type = c.kind == Kind::global &&
                          (c.text == "builtins.set" || c.text == "builtins.frozenset" ||
                           c.text == "__builtin__.set" || c.text == "__builtin__.frozenset");
    if (set_type &&
        a.kind == Kind::tuple && a.items.size() <= 1) {
      std::vector<NodeId> items;
      if (a.items.size() == 1) {
        const Node& src = nodes_[a.items[0]];
        if (src.kind != Kind::list && src.kind != Kind::tuple && src.kind != Kind::set) {
          fail(c.text + " of a " + kind_name(src.kind));
        }
        items = src.items;
      }
      return make_seq(Kind::set, std::move(items));
    }
    if (c.kind != Kind::global) fail(std::string("REDUCE of a ") + kind_name(c.kind));
    return make_seq(Kind::object, {callable, args});
  }

  void step(uint8_t op) {
    switch (op) {
      case PROTO: {
        uint8_t v = u8();
        if (v < 2 || v > 5) fail("unsupported pickle protocol " + std::to_string(v));
        return;
      }
      case FRAME: {
        uint64_t n = le(8);
        need(n);
        return;
      }
      case MARK: marks_.push_back(stack_.size()); return;
      case POP: {
        if (stack_.size() > floor()) {
          stack_.pop_back();
        } else if (!marks_.empty()) {
          pop_mark();  // POP of a bare mark
        } else {
          fail("stack underflow");
        }
        return;
      }
      case POP_MARK: pop_mark(); return;
      case DUP: push(top()); return;
      case NONE: push(make(Kind::none)); return;
      case NEWTRUE: push(make_int(1, Kind::boolean)); return;
      case NEWFALSE: push(make_int(0, Kind::boolean)); return;
      case BININT: {
        auto v = static_cast<uint32_t>(le(4));
        int32_t s = 0;
        std::memcpy(&s, &v, sizeof s);
        push(make_int(s));
        return;
      }
      case BININT1: push(make_int(static_cast<int64_t>(le(1)))); return;
      case BININT2: push(make_int(static_cast<int64_t>(le(2)))); return;
      case LONG1: {
        uint64_t n = le(1);
        push(make_long(take(n)));
        return;
      }
      case LONG4: {
        auto n = static_cast<uint32_t>(le(4));
        if (n & 0x80000000u) fail("LONG4 with a negative length");
        push(make_long(take(n)));
        return;
      }
      case BINFLOAT: {
        need(8);
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(d_[pos_ + i]);
        pos_ += 8;
        double f = 0;
        std::memcpy(&f, &v, sizeof f);
        NodeId id = make(Kind::floating);
        nodes_[id].floating = f;
        push(id);
        return;
      }
      case SHORT_BINUNICODE: push(make_text(Kind::string, take(le(1)))); return;
      case BINUNICODE: push(make_text(Kind::string, take(le(4)))); return;
      case BINUNICODE8: push(make_text(Kind::string, take(le(8)))); return;
      case SHORT_BINBYTES:
      case SHORT_BINSTRING: push(make_text(Kind::bytes, take(le(1)))); return;
      case BINBYTES: push(make_text(Kind::bytes, take(le(4)))); return;
      case BINSTRING: {
        auto n = static_cast<uint32_t>(le(4));
        if (n & 0x80000000u) fail("BINSTRING with a negative length");
        push(make_text(Kind::bytes, take(n)));
        return;
      }
      case BINBYTES8:
      case BYTEARRAY8: push(make_text(Kind::bytes, take(le(8)))); return;
      case EMPTY_LIST: push(make(Kind::list)); return;
      case APPEND: {
        NodeId v = pop();
        add_items(top(), {v}, Kind::list, "APPEND");
        return;
      }
      case APPENDS: {
        std::vector<NodeId> items = pop_mark();
        add_items(top(), items, Kind::list, "APPENDS");
        return;
      }
      case LIST: push(make_seq(Kind::list, pop_mark())); return;
      case EMPTY_TUPLE: push(make(Kind::tuple)); return;
      case TUPLE: push(make_seq(Kind::tuple, pop_mark())); return;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        size_t n = static_cast<size_t>(op - TUPLE1) + 1;
        std::vector<NodeId> items(n);
        for (size_t i = n; i-- > 0;) items[i] = pop();
        push(make_seq(Kind::tuple, std::move(items)));
        return;
      }
      case EMPTY_DICT: push(make(Kind::dict)); return;
      case DICT: {
        std::vector<NodeId> items = pop_mark();
        if (items.size() % 2 != 0) fail("DICT with an odd number of values");
        push(make_seq(Kind::dict, std::move(items)));
        return;
      }
      case SETITEM: {
        NodeId v = pop();
        NodeId k = pop();
        add_items(top(), {k, v}, Kind::dict, "SETITEM");
        return;
      }
      case SETITEMS: {
        std::vector<NodeId> items = pop_mark();
        add_items(top(), items, Kind::dict, "SETITEMS");
        return;
      }
      case EMPTY_SET: push(make(Kind::set)); return;
      case ADDITEMS: {
        std::vector<NodeId> items = pop_mark();
        add_items(top(), items, Kind::set, "ADDITEMS");
        return;
      }
      case FROZENSET: push(make_seq(Kind::set, pop_mark())); return;
      case MEMOIZE: memo_put(memo_count_++); return;
      case BINPUT: memo_put(le(1)); memo_count_ = memo_.size(); return;
      case LONG_BINPUT: memo_put(le(4)); memo_count_ = memo_.size(); return;
      case PUT: memo_put(decimal(line())); memo_count_ = memo_.size(); return;
      case BINGET: memo_get(le(1)); return;
      case LONG_BINGET: memo_get(le(4)); return;
      case GET: memo_get(decimal(line())); return;
      case GLOBAL: {
        std::string_view module = line();
        std::string_view name = line();
        push(make_text(Kind::global, std::string(module) + "." + std::string(name)));
        return;
      }
      case STACK_GLOBAL: {
        NodeId name = pop();
        NodeId module = pop();
        if (nodes_[name].kind != Kind::string || nodes_[module].kind != Kind::string) {
          fail("STACK_GLOBAL needs two str values");
        }
        push(make_text(Kind::global, nodes_[module].text + "." + nodes_[name].text));
        return;
      }
      case REDUCE: {
        NodeId args = pop();
        NodeId callable = pop();
        if (nodes_[args].kind != Kind::tuple) fail("REDUCE arguments are not a tuple");
        push(reduce(callable, args));
        return;
      }
      case NEWOBJ: {
        NodeId args = pop();
        NodeId cls = pop();
        push(make_seq(Kind::object, {cls, args}));
        return;
      }
      case NEWOBJ_EX: {
        NodeId kwargs = pop();
        NodeId args = pop();
        NodeId cls = pop();
        push(make_seq(Kind::object, {cls, args, kwargs}));
        return;
      }
      case BUILD: {
        pop();  // the state: not needed, the object stays opaque
        Node& n = nodes_[top()];
        if (n.kind != Kind::object) fail(std::string("BUILD on a ") + kind_name(n.kind));
        return;
      }
      // A class named by its copyreg extension code: opaque, like any global.
      case EXT1: push(make_text(Kind::global, "extension " + std::to_string(le(1)))); return;
      case EXT2: push(make_text(Kind::global, "extension " + std::to_string(le(2)))); return;
      case EXT4: push(make_text(Kind::global, "extension " + std::to_string(le(4)))); return;
      case READONLY_BUFFER: top(); return;  // marks the buffer on the stack read-only
      case NEXT_BUFFER:
        fail("NEXT_BUFFER: the pickle refers to an out-of-band buffer that is not in the file "
             "(pickled with a buffer_callback)");
      default:
        fail("unsupported pickle opcode " + opcode_text(op) +
             " (not something a PyTorch memory snapshot contains)");
    }
  }

  uint64_t decimal(std::string_view s) {
    if (s.empty() || s.size() > 18) fail("bad decimal memo key");
    uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') fail("bad decimal memo key");
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    return v;
  }

  std::string_view d_;
  std::vector<Node>& nodes_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<NodeId> stack_;
  std::vector<size_t> marks_;
  std::vector<NodeId> memo_;
  uint64_t memo_count_ = 0;
};

}  // namespace

const char* kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::set: return "set";
    case Kind::global: return "global";
    case Kind::object: return "object";
  }
  return "?";
}

bool Node::as_uint64(uint64_t* out) const noexcept {
  if (kind != Kind::integer) return false;
  if (range == IntRange::wider || (range == IntRange::int64 && integer < 0)) return false;
  *out = static_cast<uint64_t>(integer);
  return true;
}

bool Node::as_int64(int64_t* out) const noexcept {
  if (kind != Kind::integer || range != IntRange::int64) return false;
  *out = integer;
  return true;
}

const Node* Document::find(const Node& d, std::string_view key) const {
  for (size_t i = 0; i + 1 < d.items.size(); i += 2) {
    const Node& k = nodes_[d.items[i]];
    if (k.kind == Kind::string && k.text == key) return &nodes_[d.items[i + 1]];
  }
  return nullptr;
}

std::string Document::describe(const Node& n) const {
  switch (n.kind) {
    case Kind::integer:
      switch (n.range) {
        case IntRange::int64: return "int " + std::to_string(n.integer);
        case IntRange::uint64: return "int " + std::to_string(static_cast<uint64_t>(n.integer));
        case IntRange::wider:
          return "int wider than 64 bits (" + n.text + ")";
      }
      return "int";
    case Kind::boolean: return n.integer != 0 ? "True" : "False";
    case Kind::string: {
      std::string t = n.text.size() > 40 ? n.text.substr(0, 40) + "..." : n.text;
      return "str '" + t + "'";
    }
    case Kind::list:
    case Kind::tuple:
    case Kind::set:
      return std::string(kind_name(n.kind)) + " of " + std::to_string(n.items.size());
    case Kind::dict: return "dict of " + std::to_string(n.items.size() / 2);
    case Kind::global: return "global " + n.text;
    case Kind::object: {
      const Node& c = nodes_[n.items[0]];
      return "object of " + (c.kind == Kind::global ? c.text : std::string(kind_name(c.kind)));
    }
    default: return kind_name(n.kind);
  }
}

Document parse(std::string_view data) {
  Document doc;
  doc.nodes_.reserve(data.size() / 8);
  Machine m(data, doc.nodes_);
  doc.root_ = m.run();
  return doc;
}

}  // namespace expanse::trace::pickle
