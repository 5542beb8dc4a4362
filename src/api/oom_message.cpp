#include "api/oom_message.hpp"

#include "api/errors.hpp"
#include "api/c_stats.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace expanse::api {

std::string torch_size(uint64_t n) {
  char buf[64];
  if (n <= 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes", n);
  } else if (n <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(n) / 1024.0);
  } else if (n <= 1073741824ULL) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / 1073741824.0);
  }
  return buf;
}

std::string oom_message(uint64_t requested, int device, const expanse_stats& s,
                        const std::string& reason) {
  std::string m = "CUDA out of memory. Tried to allocate " + torch_size(requested) + ".";
  if (s.capacity_bytes != 0) {
    const bool capped = s.limit_bytes != UINT64_MAX && s.limit_bytes < s.capacity_bytes;
    const uint64_t cap = capped ? s.limit_bytes : s.capacity_bytes;
    const uint64_t free = cap > s.touched_bytes ? cap - s.touched_bytes : 0;
    m += " GPU " + std::to_string(device) + " has a total capacity of " +
         torch_size(s.capacity_bytes) + " of which " + torch_size(free) +
         " is free to expanse (not touched by live blocks" +
         (capped ? ", under its limit of " + torch_size(s.limit_bytes) : std::string()) +
         "). Of the allocated memory " + torch_size(s.allocated_bytes) +
         " is allocated by PyTorch through expanse, and " + torch_size(s.cached_bytes) +
         " is reserved by expanse but unallocated.";
  }
  // expanse's own messages start with "expanse"; anything else gets the name.
  if (!reason.empty()) {
    m += reason.rfind("expanse", 0) == 0 ? " " + reason : " expanse: " + reason;
  }
  return m;
}

}  // namespace expanse::api

extern "C" {

EXPANSE_C_API int expanse_format_oom(size_t requested, int device, const expanse_stats* stats,
                                     const char* reason, char* buf, size_t* size) {
  // reason may be expanse_last_error()'s own text: copied before anything could change it.
  const std::string why = reason != nullptr ? reason : "";
  return expanse::api::guarded([&] {
    if (size == nullptr) throw expanse::usage_error("expanse_format_oom: size is NULL");
    if (buf == nullptr && *size != 0) {
      throw expanse::usage_error("expanse_format_oom: buf is NULL with a capacity of " +
                                 std::to_string(*size) + " bytes");
    }
    expanse_stats s{};
    if (stats != nullptr) {
      // Its first struct_size bytes: a caller built against an older, shorter struct.
      std::memcpy(&s, stats, std::min<size_t>(stats->struct_size, sizeof s));
    } else {
      s.struct_size = sizeof s;
      try {
        expanse::api::fill_stats(device, &s);
      } catch (const std::exception&) {
        s = expanse_stats{};  // no figures: the message says what was asked and why it failed
      }
    }
    const std::string m = expanse::api::oom_message(requested, device, s, why);
    if (m.size() + 1 <= *size) std::memcpy(buf, m.c_str(), m.size() + 1);
    *size = m.size() + 1;
  });
}

}  // extern "C"
