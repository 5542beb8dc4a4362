// The out-of-memory message in PyTorch's words: expanse_torch_malloc's exception and the native
// PyTorch allocator's OutOfMemoryError both carry it (through expanse_format_oom).
#pragma once

#include "expanse/expanse.h"

#include <cstdint>
#include <string>

namespace expanse::api {

// PyTorch's size format in its OOM messages (c10 format_size): "512 bytes", "2.00 KiB",
// "20.00 MiB", "1.50 GiB".
std::string torch_size(uint64_t bytes);
// "CUDA out of memory. Tried to allocate <requested>." then the figures of s (none when its
// capacity is 0), then reason (after "expanse: " unless it starts with "expanse"; none if empty).
std::string oom_message(uint64_t requested, int device, const expanse_stats& s,
                        const std::string& reason);

}  // namespace expanse::api
