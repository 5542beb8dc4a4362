// Workload (b) on the sim (--sim): each trace replayed as `expanse replay` replays it, through the
// replay's host model (replay/host_model.hpp: which thread issues each operation, on which stream
// handle, how far the sim's GPU runs behind), on the sim device EXPANSE_CONF describes. The sim
// touches no page and times nothing a GPU would: its figure per pass is the modeled driver time.
#pragma once

#include "replay/host_model.hpp"
#include "trace/trace.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace expanse::peers {

struct SimReplayResult {
  std::vector<double> pass_modeled_seconds;
  std::vector<uint64_t> pass_driver_calls;
  uint64_t peak_physical = 0;  // over all passes
  uint64_t ooms = 0;
  uint64_t empty_cache_calls = 0;  // per pass
};

// expanse_conf: the EXPANSE_CONF of the column (thread_cache:0 turns the host's caches off).
SimReplayResult replay_on_sim(const trace::Trace& t, const std::string& expanse_conf,
                              const replay::HostModel& host, int passes);

}  // namespace expanse::peers
