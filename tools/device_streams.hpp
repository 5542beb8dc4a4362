// DeviceStreams moved to the replay library part (src/replay/device_streams.hpp); this name
// stays for the CLI code that still includes it from tools/.
#pragma once

#include "replay/device_streams.hpp"

namespace expanse::tools {
using replay::DeviceStreams;
}  // namespace expanse::tools
