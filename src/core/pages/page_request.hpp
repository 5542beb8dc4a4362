// What one request for pages tried, for the out-of-memory message.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace expanse::core {

struct PageRequest {
  size_t bytes = 0;
  CUstream stream = nullptr;
  size_t needed = 0;
  size_t from_pool = 0;
  size_t reclaimed = 0;
  size_t created = 0;
  bool create_oom = false;
  bool limit_hit = false;
  bool waited = false;
  bool va_exhausted = false;
  bool hopeless = false;  // more pages than the device (or limit) has left: nothing was tried
};

}  // namespace expanse::core
