// Replays a trace N times back to back on one allocator (blocks still live at the end of a pass
// are freed before the next) and prints, per pass, driver calls, modeled driver time and peak
// physical memory: the evidence for the handle-size and placement choices of issue 12. The CLI's
// `expanse replay --repeat N` is the user-facing form; this stays a bench.
//
//   expanse_bench_repeat TRACE [PASSES=3]   (EXPANSE_CONF applies: e.g. max_handle_size:2MiB)
#include "device_streams.hpp"
#include "trace.hpp"

#include "api/config.hpp"
#include "core/device_allocator.hpp"
#include "driver/driver.hpp"
#include "expanse/errors.hpp"
#include "sim/sim.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace expanse;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE [PASSES]\n", argv[0]);
    return 2;
  }
  const int passes = argc > 2 ? std::atoi(argv[2]) : 3;
  try {
    const tools::Trace t = tools::load_trace(argv[1]);
    const char* env = std::getenv("EXPANSE_CONF");
    api::Config conf = api::parse_config(env != nullptr ? env : "");
    sim::SimConfig cfg = sim::sim_config_from_string(conf.text);
    cfg.devices = 1;
    cfg.backing = false;
    auto drv = driver::load_sim(cfg, "bench");
    tools::DeviceStreams streams(*drv, 0, t.streams);
    core::DeviceAllocator alloc(*drv, 0, api::options_for_device(conf, cfg.capacity));
    std::printf("{\"trace\": \"%s\", \"peak_live_bytes\": %llu, \"passes\": [", argv[1],
                static_cast<unsigned long long>(t.peak_live_bytes));
    for (int pass = 0; pass < passes; ++pass) {
      alloc.reset_peaks();
      const core::DeviceStats s0 = alloc.stats();
      std::vector<void*> ptr(t.blocks, nullptr);
      uint64_t ooms = 0;
      for (const tools::TraceOp& op : t.ops) {
        if (op.type == tools::TraceOp::Type::alloc) {
          try {
            ptr[op.block] = alloc.allocate(op.size, streams[op.stream]);
          } catch (const out_of_memory&) {
            ++ooms;
          }
        } else if (ptr[op.block] != nullptr) {
          alloc.deallocate(ptr[op.block], streams[op.stream]);
          ptr[op.block] = nullptr;
        }
      }
      const core::DeviceStats s1 = alloc.stats();
      for (size_t b = 0; b < ptr.size(); ++b) {
        if (ptr[b] != nullptr) alloc.deallocate(ptr[b], streams[0]);
      }
      std::printf("%s{\"driver_calls_total\": %llu, \"modeled_driver_seconds\": %.6f, "
                  "\"peak_physical_bytes\": %llu, \"ooms\": %llu}",
                  pass == 0 ? "" : ", ",
                  static_cast<unsigned long long>(s1.total_driver_calls() - s0.total_driver_calls()),
                  (s1.modeled_driver_ns - s0.modeled_driver_ns) * 1e-9,
                  static_cast<unsigned long long>(s1.peak_physical_bytes),
                  static_cast<unsigned long long>(ooms));
    }
    std::printf("]}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
