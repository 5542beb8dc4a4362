#include "report/replay_report.hpp"

#include <chrono>

namespace expanse::replay {

ReplayReport make_replay_report(const ReplayRequest& req, const ReportProgress& progress) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto report = [&](double f, const std::string& label) {
    if (progress) progress(f, label);
  };
  auto fraction = [](uint64_t done, uint64_t total) {
    return total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  };

  report(0, "reading " + req.path);
  ReplayReport rep;
  rep.trace = trace::load_trace(req.path, req.device);
  rep.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  ReplayOptions o;
  o.progress = [&](uint64_t done, uint64_t total) { report(fraction(done, total), "replay"); };
  o.passes = req.repeat;
  o.host = req.host;
  rep.replay = replay_trace(rep.trace, req.conf, req.capacity, o);
  if (req.min_capacity) {
    rep.min_capacity = find_min_capacity(
        rep.trace, req.conf, req.capacity,
        [&](int probe, int expected, uint64_t done, uint64_t total) {
          report((probe - 1 + fraction(done, total)) / expected,
                 "min-capacity: replay " + std::to_string(probe) + "/" +
                     std::to_string(expected));
        },
        req.host);
  }
  rep.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

}  // namespace expanse::replay
