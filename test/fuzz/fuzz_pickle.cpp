// The pickle reader on any bytes: a Document or a parse_error, never a crash, and every node it
// returns is well formed (items name nodes that exist).
#include "trace/pickle_reader.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace pickle = expanse::trace::pickle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    const pickle::Document doc = pickle::parse(in);
    if (doc.root() >= doc.size()) std::abort();
    for (size_t i = 0; i < doc.size(); ++i) {
      const pickle::Node& n = doc[static_cast<pickle::NodeId>(i)];
      for (pickle::NodeId id : n.items) {
        if (id >= doc.size()) std::abort();
      }
      if (n.offset >= size) std::abort();
      (void)doc.describe(n);
    }
  } catch (const pickle::parse_error& e) {
    if (e.offset() > size) std::abort();  // the byte named must lie within the data
  }
  return 0;
}
