// A small, strict reader of Python pickles (protocols 2 to 5), enough for PyTorch memory
// snapshots: dicts, lists, tuples, sets, str, bytes, ints (of any width: wider ones are kept
// opaque), floats, None, bools, the memo, frames. Nothing is ever executed: GLOBAL /
// STACK_GLOBAL / EXT* give an opaque "global" node, and REDUCE / NEWOBJ / BUILD an opaque
// "object" node (collections.OrderedDict becomes a dict). Anything else is an error naming the
// byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace expanse::trace::pickle {

// Malformed, truncated or unsupported input. offset() is the byte the problem was found at.
class parse_error : public std::runtime_error {
 public:
  parse_error(uint64_t offset, const std::string& what)
      : std::runtime_error("byte " + std::to_string(offset) + ": " + what), offset_(offset) {}
  uint64_t offset() const noexcept { return offset_; }

 private:
  uint64_t offset_;
};

enum class Kind : uint8_t {
  none,
  boolean,
  integer,
  floating,
  string,  // str (UTF-8 bytes, not validated)
  bytes,   // bytes, bytearray, Python 2 str
  list,
  tuple,
  dict,    // items: key, value, key, value, ... in insertion order
  set,     // set and frozenset
  global,  // text: "module.name"
  object,  // the result of REDUCE / NEWOBJ: items[0] is the callable (a global), items[1] args
};

const char* kind_name(Kind k) noexcept;

// Where an int's value lies. Pickle ints have any width: a C++ uint64_t field (a stack frame's
// line number 2^64-1) is a 9-byte LONG1, and a value that does not matter to the reader must
// never make the document unreadable.
enum class IntRange : uint8_t {
  int64,   // Node::integer is the value
  uint64,  // 2^63 <= value < 2^64: Node::integer holds its bits
  wider,   // beyond 64 bits: Node::integer is its sign (-1 or 1), Node::text its bytes in hex
};

using NodeId = uint32_t;

struct Node {
  Kind kind = Kind::none;
  uint64_t offset = 0;  // byte offset of the opcode that created it
  int64_t integer = 0;  // integer (see range), boolean (0/1)
  IntRange range = IntRange::int64;  // integer only
  double floating = 0;
  std::string text;     // string, bytes, global
  std::vector<NodeId> items;

  // The value of an int that fits the type; false for other kinds, negative values (as_uint64)
  // and values out of range.
  bool as_uint64(uint64_t* out) const noexcept;
  bool as_int64(int64_t* out) const noexcept;
};

class Document {
 public:
  NodeId root() const noexcept { return root_; }
  const Node& operator[](NodeId id) const { return nodes_[id]; }
  size_t size() const noexcept { return nodes_.size(); }

  // The value of `key` (a str) in dict d, or nullptr. d must be a dict.
  const Node* find(const Node& d, std::string_view key) const;
  // "dict", "list of 3", "str 'alloc'", "int 42": for messages.
  std::string describe(const Node& n) const;

 private:
  friend Document parse(std::string_view data);
  std::vector<Node> nodes_;
  NodeId root_ = 0;
};

// Parses one pickle that must span all of data (bytes after STOP are an error).
Document parse(std::string_view data);

}  // namespace expanse::trace::pickle
