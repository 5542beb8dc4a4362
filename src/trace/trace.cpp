#include "trace/trace.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace expanse::trace {

Trace load_trace(const std::string& path, int device) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw input_error(path + ": cannot open: " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw input_error(path + ": read error: " + std::strerror(errno));
  const std::string data = ss.str();
  if (data.empty()) throw input_error(path + ": empty file: not a trace");

  auto ends_with = [&](const char* ext) {
    size_t n = std::strlen(ext);
    return path.size() >= n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (data.compare(0, 4, "PK\x03\x04") == 0) {
    throw input_error(path +
                      ": byte 0: a zip archive (torch.save?), not a snapshot pickle: write the "
                      "snapshot with torch.cuda.memory._dump_snapshot(path) or pickle.dump()");
  }
  const bool pickle_name = ends_with(".pickle") || ends_with(".pkl");
  if (static_cast<uint8_t>(data[0]) == 0x80 || pickle_name) {
    return load_snapshot(path, data, device);
  }
  if (data.find("Action") < data.find('\n') || ends_with(".csv")) {
    return load_rmm_csv(path, data);
  }
  throw input_error(path +
                    ": byte 0: neither a PyTorch memory snapshot pickle (which starts with byte "
                    "0x80) nor an RMM log CSV (header Thread,Time,Action,Pointer,Size,Stream)");
}

}  // namespace expanse::trace
