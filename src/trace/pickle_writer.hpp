// A small writer of Python pickles (protocol 2), for memory snapshots in PyTorch's format.
//
// It uses only the opcodes that both Python's pickle and the unpickler inside PyTorch's
// memory_viz page (torch/utils/viz/MemoryViz.js) read: PROTO, EMPTY_DICT / EMPTY_LIST, MARK,
// SETITEMS, APPENDS, BININT1 / BININT2 / BININT / LONG1, BINUNICODE, BINFLOAT, NEWTRUE /
// NEWFALSE, NONE, TUPLE2, STOP. Lists are appended in batches of 1000, as Python does, so no
// single APPENDS carries a huge argument list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace expanse::trace::pickle {

class Writer {
 public:
  Writer();

  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void floating(double v);
  void str(std::string_view s);
  // A dict: begin_dict(), then key, value, key, value ..., then end_dict().
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  // The tuple (a, b).
  void int_pair(int64_t a, int64_t b);

  // The pickle (STOP appended). All containers must be closed.
  std::string finish();

 private:
  struct Level {
    bool list;
    size_t pending;  // list: items since the last APPENDS
  };
  void op(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  // A container: its empty opcode and MARK; then the opcode that adds the items marked since.
  void open(uint8_t empty, bool list);
  void close(uint8_t add_items);
  void le(uint64_t v, int bytes);
  void value_done();

  std::string out_;
  std::vector<Level> levels_;
};

}  // namespace expanse::trace::pickle
