// EXPANSE_CONF: comma-separated key:value pairs (the PYTORCH_ALLOC_CONF convention).
//
// Parsing has a home of its own below every layer because the library (api/, core/), the
// standalone sim driver (libexpanse_simcuda.so, loaded in place of libcuda.so.1) and the tools
// all read it. A bad key or value is
// an error naming it, never ignored.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace expanse::conf {

// Every key expanse understands, in any layer.
const std::vector<std::string>& known_keys();

// Splits "a:1,b:2" into pairs. Whitespace around keys and values is dropped; empty items are
// skipped. Throws std::invalid_argument naming the item for a missing ':' or an unknown key, and
// for a key given twice.
std::vector<std::pair<std::string, std::string>> parse_pairs(std::string_view conf);

// "80GiB", "2MiB", "512", "1.5GiB", "4096B" → bytes. Units: B, KiB, MiB, GiB, TiB (also KB, MB,
// GB, TB as powers of 1000). Throws std::invalid_argument naming the text for anything else and
// for values that overflow size_t.
size_t parse_size(std::string_view text);
// Like parse_size, but errors name the key too ("sim_capacity: ...").
size_t parse_size_for(std::string_view key, std::string_view text);
long long parse_int_for(std::string_view key, std::string_view text, long long lo, long long hi);
bool parse_bool_for(std::string_view key, std::string_view text);

// "80 GiB", "1.50 MiB", "512 B": for messages.
std::string format_size(size_t bytes);

// The EXPANSE_CONF environment variable, or "" when unset.
std::string from_environment();

}  // namespace expanse::conf
