// The benchmark's command line (parsed the same way in the parent and in each child).
#pragma once

#include <string>
#include <vector>

namespace expanse::peers {

struct Options {
  double seconds = 0.3;  // per hot-path figure, per round
  int rounds = 3;        // hot path: best of
  int passes = 2;        // trace: passes over it in one process
  bool sim = false;      // expanse on its sim only (no GPU): a smoke run of the program
  // With --sim: how the traces are issued (expanse replay --host: torch, plain, or keys), as the
  // replay issues them; "" is the replay's default (torch).
  std::string host;
  std::vector<std::string> only;    // kinds to run (all when empty), names as in the table
  std::vector<std::string> traces;  // PyTorch snapshot pickles
  int child = -1;                   // internal: the kind this process runs

  // The arguments that reproduce these options (child and traces aside).
  std::vector<std::string> to_args() const;
};

// Throws std::invalid_argument naming the bad argument.
Options parse_options(int argc, char** argv);

constexpr const char* kUsage =
    "usage: expanse_peers_bench [--seconds S] [--rounds R] [--passes P] [--sim [--host MODEL]]\n"
    "                           [--only 'NAME,NAME'] [TRACE.pickle ...]\n"
    "  --sim: the expanse columns on the sim, no GPU; the traces are replayed as expanse replay\n"
    "  replays them, through its host model (--host, default torch: backward passes on a second\n"
    "  thread, thread caches, the GPU running behind), with modeled driver seconds per pass\n"
    "  EXPANSE_PEER_CONF: EXPANSE_CONF of the expanse columns (default driver:cuda;\n"
    "  with --sim driver:sim,sim_backing:false)\n";

}  // namespace expanse::peers
