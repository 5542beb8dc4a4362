#include "driver/driver.hpp"

#include <dlfcn.h>

namespace expanse::driver {

LoadedDriver::~LoadedDriver() {
  // The real libcuda.so.1 is never unloaded (its atexit handlers and threads outlive us); a sim
  // library loaded from a path may be.
  if (dl_ != nullptr && kind_ == DriverKind::sim) dlclose(dl_);
}

std::string LoadedDriver::describe_error(EntryPoint e, CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (table_.get_error_name != nullptr) table_.get_error_name(r, &name);
  if (table_.get_error_string != nullptr) table_.get_error_string(r, &text);
  std::string out = entry_point_name(e);
  out += ": ";
  out += name != nullptr ? name : ("CUresult " + std::to_string(static_cast<int>(r)));
  if (text != nullptr) {
    out += " (";
    out += text;
    out += ")";
  }
  return out;
}

void LoadedDriver::check(CUresult r, EntryPoint e, const char* context) const {
  if (r == CUDA_SUCCESS) return;
  std::string msg = describe_error(e, r);
  if (context != nullptr) msg = std::string(context) + ": " + msg;
  throw driver_error(msg, r);
}

}  // namespace expanse::driver
