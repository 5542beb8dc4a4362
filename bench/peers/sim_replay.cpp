#include "peers/sim_replay.hpp"

#include "conf/config.hpp"
#include "conf/sim_options.hpp"
#include "replay/replay.hpp"

namespace expanse::peers {

SimReplayResult replay_on_sim(const trace::Trace& t, const std::string& expanse_conf,
                              const replay::HostModel& host, int passes) {
  const conf::Config conf = conf::parse_config(expanse_conf);
  const size_t g = replay::replay_granularity(conf);
  const size_t capacity = conf::parse_sim_options(expanse_conf).capacity;
  replay::ReplayOptions ro;
  ro.host = host;
  ro.passes = passes;
  const replay::ReplayResult r = replay::replay_trace(t, conf, capacity / g * g, ro);
  SimReplayResult out;
  for (const replay::PassResult& p : r.passes) {
    out.pass_modeled_seconds.push_back(p.modeled_driver_seconds);
    out.pass_driver_calls.push_back(p.driver_calls_total);
  }
  out.peak_physical = r.stats.peak_physical_bytes;
  out.ooms = r.ooms;
  for (const trace::TraceRelease& rel : t.releases) {
    out.empty_cache_calls += rel.kind == trace::TraceRelease::Kind::empty_cache ? 1 : 0;
  }
  return out;
}

}  // namespace expanse::peers
