#include "conf/config.hpp"

#include "conf/env_config.hpp"
#include "conf/sim_options.hpp"
#include "expanse/errors.hpp"

#include <cstdlib>

namespace expanse::conf {
namespace {

bool looks_fractional(const std::string& v) {
  return v.find('.') != std::string::npos &&
         v.find_first_not_of("0123456789.") == std::string::npos;
}

// "0.8" (a fraction of capacity) or a size.
void parse_limit(const std::string& v, Config& c) {
  if (looks_fractional(v)) {
    char* end = nullptr;
    double f = std::strtod(v.c_str(), &end);
    if (end == nullptr || *end != '\0' || !(f > 0.0) || f > 1.0) {
      throw usage_error("EXPANSE_CONF: key 'limit': '" + v +
                        "' is neither a size nor a fraction in (0, 1]");
    }
    c.limit_fraction = f;
    return;
  }
  c.allocator.limit = parse_size_for("limit", v);
}

}  // namespace

ReserveSpec parse_reserve(const std::string& what, const std::string& v) {
  ReserveSpec r;
  if (v == "free") {
    r.free = true;
    return r;
  }
  if (looks_fractional(v)) {
    char* end = nullptr;
    const double f = std::strtod(v.c_str(), &end);
    if (end == nullptr || *end != '\0' || !(f > 0.0) || f > 1.0) {
      throw usage_error(what + ": '" + v + "' is not free, a size, or a fraction in (0, 1]");
    }
    r.fraction = f;
    return r;
  }
  try {
    r.bytes = parse_size(v);
  } catch (const std::invalid_argument&) {
    throw usage_error(what + ": '" + v + "' is not free, a size, or a fraction in (0, 1]");
  }
  return r;
}

Config parse_config(const std::string& text) {
  Config c;
  c.text = text;
  c.allocator.thread_cache_bytes = kDefaultThreadCacheBytes;
  c.allocator.thread_cache_entries = kDefaultThreadCacheEntries;
  try {
    for (const auto& [key, value] : parse_pairs(text)) {
      if (key == "page_size") {
        c.allocator.page_size = parse_size_for(key, value);
        if (c.allocator.page_size == 0) {
          throw usage_error("EXPANSE_CONF: key 'page_size' must not be 0");
        }
      } else if (key == "limit") {
        parse_limit(value, c);
      } else if (key == "host_limit") {
        c.host_limit = parse_size_for(key, value);
      } else if (key == "reserve") {
        const ReserveSpec r = parse_reserve("EXPANSE_CONF: key 'reserve'", value);
        c.allocator.reserve_free = r.free;
        c.allocator.reserve_bytes = r.bytes;
        c.reserve_fraction = r.fraction;
      } else if (key == "reserve_margin") {
        c.allocator.reserve_margin = parse_size_for(key, value);
      } else if (key == "reserve_partial") {
        c.allocator.reserve_partial = parse_bool_for(key, value);
      } else if (key == "reserve_handle_size") {
        c.allocator.reserve_handle_size = parse_size_for(key, value);
      } else if (key == "reserve_may_dip") {
        c.allocator.reserve_may_dip = parse_bool_for(key, value);
      } else if (key == "release_threshold") {
        c.allocator.release_threshold = parse_size_for(key, value);
      } else if (key == "reclaim_first") {
        c.allocator.reclaim_before_create = parse_bool_for(key, value);
      } else if (key == "max_handle_size") {
        c.allocator.max_handle_size = parse_size_for(key, value);
      } else if (key == "high_water_slack") {
        c.allocator.high_water_slack =
            value == "none" ? kNoLimit : parse_size_for(key, value);
      } else if (key == "thread_cache") {
        c.allocator.thread_cache_bytes = parse_size_for(key, value);
      } else if (key == "thread_cache_entries") {
        c.allocator.thread_cache_entries = parse_size_for(key, value);
      } else if (key == "va_size") {
        c.allocator.va_size = parse_size_for(key, value);
      } else if (key == "va_budget") {
        c.allocator.va_budget = parse_size_for(key, value);
      } else if (key == "peer_access") {
        if (value != "auto" && value != "none") {
          throw usage_error("EXPANSE_CONF: key 'peer_access': '" + value +
                            "' is not one of auto, none");
        }
        c.allocator.peer_access_auto = value == "auto";
      } else if (key == "null_stream") {
        if (value != "legacy" && value != "per_thread") {
          throw usage_error("EXPANSE_CONF: key 'null_stream': '" + value +
                            "' is not one of legacy, per_thread");
        }
        c.allocator.null_stream_per_thread = value == "per_thread";
      } else if (key == "registrable") {
        c.allocator.registrable = parse_bool_for(key, value);
      } else if (key == "rdma") {
        if (value != "auto" && value != "off") {
          throw usage_error("EXPANSE_CONF: key 'rdma': '" + value + "' is not one of auto, off");
        }
        c.allocator.rdma = value == "auto";
      } else if (key == "driver") {
        if (value != "auto" && value != "cuda" && value != "sim") {
          throw usage_error("EXPANSE_CONF: key 'driver': '" + value +
                            "' is not one of auto, cuda, sim");
        }
      }
      // driver_library is read by the driver loader; sim_* keys by the sim (validated below).
    }
    (void)parse_sim_options(text);
  } catch (const usage_error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  return c;
}

AllocatorOptions options_for_device(const Config& c, size_t capacity) {
  AllocatorOptions o = c.allocator;
  if (c.limit_fraction > 0) {
    o.limit = static_cast<size_t>(static_cast<double>(capacity) * c.limit_fraction);
  }
  if (c.reserve_fraction > 0) {
    o.reserve_bytes = static_cast<size_t>(static_cast<double>(capacity) * c.reserve_fraction);
  }
  return o;
}

}  // namespace expanse::conf
