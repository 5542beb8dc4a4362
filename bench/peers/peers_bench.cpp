// expanse beside its peers on one GPU, each figure from the same run of this program:
// expanse (with and without thread caches), cudaMallocAsync on the default memory pool,
// PyTorch's caching allocator (plain and expandable segments, from C++ through libc10_cuda.so)
// and RMM's pool and arena resources, on
//   (a) the hot path: allocate+free pairs of 4 KiB and 1 MiB at 1 and 8 threads, each thread on
//       its own stream: ns per pair as one thread sees it, and the 8-thread/1-thread ratio;
//   (b) each recorded PyTorch snapshot given, executed for real: allocations and frees in the
//       recorded order, every block's pages written on its stream: wall time per pass, peak
//       reserved (each allocator's own figure), OOMs.
// Each allocator runs in a child process of its own (child_run.hpp). Built only with
// -DEXPANSE_BUILD_PEER_BENCH=ON (CUDA runtime needed; PyTorch and RMM optional, found at
// configure time: bench/peers/CMakeLists.txt). test/gpu/run_on_gpu.sh's step `peers` builds and
// runs it on a GPU.
//
//   build-peers/bin/expanse_peers_bench [--seconds 0.3] [--rounds 3] [--passes 2] TRACE...
//   build-peers/bin/expanse_peers_bench --sim [--host MODEL] TRACE...
//       (no GPU: the expanse columns on the sim, each trace replayed as `expanse replay` replays
//        it, through the replay's host model, default torch: figures per pass are modeled driver
//        seconds)
#include "peers/child_run.hpp"
#include "peers/gpu.hpp"
#include "peers/hot_path.hpp"
#include "peers/options.hpp"
#include "peers/peer.hpp"
#include "peers/sim_replay.hpp"
#include "peers/trace_run.hpp"
#include "replay/host_model.hpp"
#include "trace/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace expanse::peers;

constexpr size_t kHotSizes[] = {size_t{4096}, size_t{1} << 20};
constexpr int kHotThreads[] = {1, 8};

std::string expanse_conf(const Options& o) {
  const char* c = std::getenv("EXPANSE_PEER_CONF");
  if (c != nullptr && *c != '\0') return c;
  return o.sim ? "driver:sim,sim_backing:false" : "driver:cuda";
}

// The host model the sim replays traces through (--host, the replay's default otherwise).
expanse::replay::HostModel host_of(const Options& o) {
  return o.host.empty() ? expanse::replay::default_host_model()
                        : expanse::replay::parse_host_model(o.host);
}

// Child: runs one allocator through both workloads, one result line each.
int run_one(const Options& o, const PeerKind& kind) {
  try {
    Gpu gpu(!o.sim);
    gpu.bind_thread();
    auto peer = kind.make();
    std::printf("source %s\n", peer->peak_source());
    for (size_t bytes : kHotSizes) {
      for (int threads : kHotThreads) {
        const double ns = hot_path_ns_per_pair(*peer, gpu, bytes, threads, o.seconds, o.rounds);
        std::printf("hot %zu %d %.1f\n", bytes, threads, ns);
        std::fflush(stdout);
      }
    }
    for (size_t i = 0; i < o.traces.size(); ++i) {
      const auto t = expanse::trace::load_trace(o.traces[i]);
      if (o.sim) {
        // As the replay issues it, through the host model, on a sim device of its own.
        const char* conf = std::getenv("EXPANSE_CONF");
        const SimReplayResult r = replay_on_sim(t, conf != nullptr ? conf : "", host_of(o),
                                                o.passes);
        std::printf("trace %zu %llu %llu %llu", i, static_cast<unsigned long long>(r.peak_physical),
                    static_cast<unsigned long long>(r.ooms),
                    static_cast<unsigned long long>(r.empty_cache_calls));
        for (size_t p = 0; p < r.pass_modeled_seconds.size(); ++p) {
          std::printf(" %.4f/%llu", r.pass_modeled_seconds[p],
                      static_cast<unsigned long long>(r.pass_driver_calls[p]));
        }
        std::printf("\n");
        std::fflush(stdout);
        continue;
      }
      // What the previous workload left cached goes back, and the allocator starts afresh
      // where it can (RMM's resources; expanse and PyTorch are process-wide).
      peer->release_cached();
      peer.reset();
      peer = kind.make();
      const TraceRunResult r = run_trace(*peer, gpu, t, o.passes);
      std::printf("trace %zu %llu %llu %llu", i, static_cast<unsigned long long>(r.peak_reserved),
                  static_cast<unsigned long long>(r.ooms),
                  static_cast<unsigned long long>(r.empty_cache_calls));
      for (double s : r.pass_seconds) std::printf(" %.4f", s);
      std::printf("\n");
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_peers_bench: %s: %s\n", kind.name.c_str(), e.what());
    return 1;
  }
  return 0;
}

struct KindResult {
  std::string left_out;  // why there is no figure
  std::string source;
  std::map<std::pair<size_t, int>, double> hot_ns;
  std::map<size_t, std::vector<std::string>> trace_fields;  // peak ooms empty_cache secs...
};

KindResult collect(const ChildOutput& out) {
  KindResult r;
  for (const auto& line : out.lines) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "source") {
      std::getline(in >> std::ws, r.source);
    } else if (what == "hot") {
      size_t bytes = 0;
      int threads = 0;
      double ns = 0;
      in >> bytes >> threads >> ns;
      r.hot_ns[{bytes, threads}] = ns;
    } else if (what == "trace") {
      size_t i = 0;
      in >> i;
      for (std::string f; in >> f;) r.trace_fields[i].push_back(f);
    }
  }
  if (!out.how_ended.empty()) r.left_out = "failed (" + out.how_ended + "; its message above)";
  return r;
}

std::string cell(const std::map<std::pair<size_t, int>, double>& m, size_t b, int t) {
  auto it = m.find({b, t});
  if (it == m.end()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", it->second);
  return buf;
}

std::string ratio(const std::map<std::pair<size_t, int>, double>& m, size_t b) {
  auto one = m.find({b, 1}), eight = m.find({b, 8});
  if (one == m.end() || eight == m.end()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", eight->second / one->second);
  return buf;
}

void print_tables(const Options& o, const std::vector<PeerKind>& kinds,
                  const std::vector<KindResult>& res,
                  const std::vector<expanse::trace::Trace>& traces) {
  std::printf("\n(a) allocate+free pair: ns per pair as one thread sees it, each thread on its "
              "own stream; best of %d runs of %.2f s\n",
              o.rounds, o.seconds);
  std::printf("%-24s | %10s %10s %6s | %10s %10s %6s\n", "allocator", "4K 1 thr", "4K 8 thr",
              "8/1", "1M 1 thr", "1M 8 thr", "8/1");
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto& m = res[k].hot_ns;
    if (m.empty()) continue;
    std::printf("%-24s | %10s %10s %6s | %10s %10s %6s\n", kinds[k].name.c_str(),
                cell(m, 4096, 1).c_str(), cell(m, 4096, 8).c_str(), ratio(m, 4096).c_str(),
                cell(m, 1 << 20, 1).c_str(), cell(m, 1 << 20, 8).c_str(),
                ratio(m, 1 << 20).c_str());
  }
  for (size_t i = 0; i < traces.size(); ++i) {
    const auto& t = traces[i];
    size_t empty_cache = 0;
    for (const auto& r : t.releases) {
      empty_cache += r.kind == expanse::trace::TraceRelease::Kind::empty_cache;
    }
    std::printf("\n(b) %s: %zu ops on %zu stream(s), peak live %llu bytes, %zu empty_cache() "
                "inferred; %d passes%s\n",
                t.path.c_str(), t.ops.size(), t.streams.size(),
                static_cast<unsigned long long>(t.peak_live_bytes), empty_cache, o.passes,
                o.sim ? (" (sim, replayed through the host model " + host_of(o).describe() +
                         ")").c_str()
                      : ", every block's pages written");
    std::printf("%-24s | %22s | %6s | %s\n", "allocator", "peak reserved (x live)", "OOMs",
                o.sim ? "modeled driver s / driver calls, per pass" : "wall s per pass");
    for (size_t k = 0; k < kinds.size(); ++k) {
      auto it = res[k].trace_fields.find(i);
      if (!res[k].left_out.empty() && it == res[k].trace_fields.end()) continue;
      if (it == res[k].trace_fields.end() || it->second.size() < 3) {
        std::printf("%-24s | %22s |\n", kinds[k].name.c_str(), "no result");
        continue;
      }
      const auto& f = it->second;
      const double peak = std::atof(f[0].c_str());
      char pk[64];
      std::snprintf(pk, sizeof pk, "%.0f (%.4f)", peak,
                    t.peak_live_bytes ? peak / static_cast<double>(t.peak_live_bytes) : 0.0);
      std::string secs;
      for (size_t j = 3; j < f.size(); ++j) secs += (j > 3 ? " " : "") + f[j];
      std::printf("%-24s | %22s | %6s | %s\n", kinds[k].name.c_str(), pk, f[1].c_str(),
                  secs.c_str());
    }
  }
  std::printf("\npeak reserved is each allocator's own figure:\n");
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (!res[k].source.empty()) {
      std::printf("  %-24s %s\n", kinds[k].name.c_str(), res[k].source.c_str());
    }
  }
  bool any = false;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (res[k].left_out.empty()) continue;
    if (!any) std::printf("\nleft out:\n");
    any = true;
    std::printf("  %-24s %s\n", kinds[k].name.c_str(), res[k].left_out.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_peers_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  const std::string conf = expanse_conf(o);
  const std::vector<PeerKind> kinds = peer_kinds(conf);
  if (o.child >= 0) {
    if (static_cast<size_t>(o.child) >= kinds.size() || !kinds[o.child].make) return 2;
    return run_one(o, kinds[static_cast<size_t>(o.child)]);
  }

  std::vector<expanse::trace::Trace> traces;
  try {
    if (o.sim) (void)host_of(o);  // a bad --host is named before any child runs
    for (const auto& p : o.traces) traces.push_back(expanse::trace::load_trace(p));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_peers_bench: %s\n", e.what());
    return 2;
  }
  std::printf("expanse columns: EXPANSE_CONF=%s%s\n", conf.c_str(),
              o.sim ? " (--sim: expanse on its sim, no GPU)" : "");
  std::vector<KindResult> res(kinds.size());
  int failures = 0;
  for (size_t k = 0; k < kinds.size(); ++k) {
    const PeerKind& kind = kinds[k];
    if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), kind.name) == o.only.end()) {
      res[k].left_out = "not in --only";
      continue;
    }
    if (!kind.left_out.empty()) {
      res[k].left_out = kind.left_out;
      continue;
    }
    if (o.sim && kind.needs_gpu) {
      res[k].left_out = "needs a GPU (--sim)";
      continue;
    }
    std::printf("running %s ...\n", kind.name.c_str());
    std::vector<std::string> args = o.to_args();
    args.push_back("--child");
    args.push_back(std::to_string(k + 1));
    for (const auto& t : o.traces) args.push_back(t);
    res[k] = collect(run_child(args, kind.env));
    failures += !res[k].left_out.empty();
  }
  print_tables(o, kinds, res, traces);
  return failures == 0 ? 0 : 1;
}
