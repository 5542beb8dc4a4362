// api/'s names for the library's reading of EXPANSE_CONF (parsed in conf/config.hpp) and for the
// allocator options it yields (core/options.hpp).
#pragma once

#include "conf/config.hpp"
#include "core/options.hpp"

namespace expanse::api {

using conf::Config;
using conf::options_for_device;
using conf::parse_config;

}  // namespace expanse::api
