// Random operation sequences (allocate, free, record_stream, release_cached, set_limit, streams
// held, destroyed and made again, graph captures, peer access, driver failures injected at random
// calls) on several option sets: every step's stats, sim call counts, memory-history events and
// segment shapes, hashed and compared with the figures recorded for the same sequences. Any change
// in what the allocator does (placement, driver calls and their order of kinds, accounting, stream
// order) changes a hash. EXPANSE_OP_TRACE_DIR=dir writes each sequence's steps, with addresses and
// error messages, to dir/<config>_<seed>.txt, to diff two builds.
#include "core_fixture.hpp"
#include "core/streams/capture_announcements.hpp"
#include "expanse/errors.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace expanse::test {
namespace {

using driver::EntryPoint;

// Counts the memory history's events and sums their bytes.
struct CountingEvents : core::AllocatorEvents {
  uint64_t allocs = 0, frees = 0, maps = 0, unmaps = 0, ooms = 0, mapped = 0, unmapped = 0;
  void on_alloc(int, CUdeviceptr, size_t, CUstream) noexcept override { ++allocs; }
  void on_free(int, CUdeviceptr, size_t, CUstream) noexcept override { ++frees; }
  void on_map(int, CUdeviceptr, size_t n) noexcept override {
    ++maps;
    mapped += n;
  }
  void on_unmap(int, CUdeviceptr, size_t n) noexcept override {
    ++unmaps;
    unmapped += n;
  }
  void on_oom(int, size_t, CUstream, size_t) noexcept override { ++ooms; }
};

// Device 0's primary context current on this thread for the scope.
struct CurrentPrimary {
  explicit CurrentPrimary(const driver::DriverTable& t) : t_(t) {
    t_.device_get(&dev_, 0);
    t_.device_primary_ctx_retain(&ctx_, dev_);
    t_.ctx_push_current(ctx_);
  }
  ~CurrentPrimary() {
    CUcontext popped = nullptr;
    t_.ctx_pop_current(&popped);
    t_.device_primary_ctx_release(dev_);
  }
  CurrentPrimary(const CurrentPrimary&) = delete;
  CurrentPrimary& operator=(const CurrentPrimary&) = delete;
  const driver::DriverTable& t_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

// One option set a sequence runs with.
struct TraceConfig {
  const char* name;
  core::AllocatorOptions opts;
  bool inject;                 // driver failures injected at random calls
  int driver_version = 13000;  // below 12000: no cuStreamGetId (every stream unknown)
  int devices = 1;             // 2: enable_peer_access(1) now and then
};

std::vector<TraceConfig> trace_configs() {
  std::vector<TraceConfig> out;
  core::AllocatorOptions o;
  out.push_back({"default", o, false});
  out.push_back({"default_inject", o, true});
  o = {};
  o.lifo_depth = 0;
  o.reclaim_before_create = true;
  out.push_back({"reclaim_first_inject", o, true});
  o = {};
  o.high_water_slack = 0;
  o.release_threshold = 64 * MiB;
  out.push_back({"high_water_threshold_inject", o, true});
  o = {};
  o.max_handle_size = 0;
  o.limit = 700 * MiB;
  out.push_back({"page_handles_limit_inject", o, true});
  o = {};
  o.va_size = 512 * MiB;
  o.small_va_size = 64 * MiB;
  o.va_budget = 1536 * MiB;
  out.push_back({"small_va_inject", o, true});
  o = {};
  o.max_handle_size = 8 * MiB;
  o.small_max = 4 * MiB;
  out.push_back({"small_handles", o, false});
  o = {};
  out.push_back({"no_stream_ids_inject", o, true, 11080});
  o = {};
  o.peer_access_auto = false;
  out.push_back({"two_devices_inject", o, true, 13000, 2});
  return out;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

class OperationSequenceTest : public CoreTest {
 protected:
  struct Trace {
    std::string full;     // every step, with addresses and error messages
    std::string figures;  // every step's figures only (no address, no message)
  };
  Trace run(const TraceConfig& tc, uint64_t seed, size_t steps) {
    sim::SimConfig cfg = sim_config(1 * GiB, true, tc.devices);
    cfg.driver_version = tc.driver_version;
    make(cfg, tc.opts);
    sim::reset_counts();
    CountingEvents events;
    alloc_->set_events(&events);
    const auto& t = drv_->table();
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
    std::vector<CUstream> ss = {nullptr, new_stream(), new_stream(), new_stream(),
                                CU_STREAM_PER_THREAD, CU_STREAM_LEGACY};
    std::vector<bool> held(ss.size(), false);
    std::vector<int> capturing(ss.size(), 0);  // 1: capturing, 2: capturing, announced
    CUcontext primary = nullptr;
    {
      CurrentPrimary c(t);
      primary = c.ctx_;
    }
    auto end_capture = [&](size_t s) {
      CUgraph g = nullptr;
      const CUresult r = t.stream_end_capture(ss[s], &g);
      if (g != nullptr) t.graph_destroy(g);
      if (capturing[s] == 2) core::CaptureAnnouncements::end(primary);
      capturing[s] = 0;
      return r;
    };
    struct Live {
      void* p;
      size_t n;
      size_t stream;
    };
    std::vector<Live> live;
    std::ostringstream out, addresses;
    const std::vector<EntryPoint> faults = {
        EntryPoint::mem_create,        EntryPoint::mem_map,
        EntryPoint::mem_set_access,    EntryPoint::mem_unmap,
        EntryPoint::mem_release,       EntryPoint::mem_address_reserve,
        EntryPoint::mem_address_free,  EntryPoint::event_record,
        EntryPoint::event_query,       EntryPoint::event_synchronize,
        EntryPoint::ctx_synchronize,   EntryPoint::event_create};
    for (size_t step = 0; step < steps; ++step) {
      const size_t op = pick(100);
      std::string what, message;
      try {
        if (op < 40) {
          size_t n = 0;
          const size_t kind = pick(10);
          if (kind < 5) {
            n = 1 + pick(1 * MiB);
          } else if (kind < 9) {
            n = 1 * MiB + pick(40 * MiB);
          } else {
            n = 64 * MiB + pick(256 * MiB);
          }
          const size_t s = pick(ss.size());
          what = "alloc " + std::to_string(n) + " s" + std::to_string(s);
          void* p = alloc_->allocate(n, ss[s]);
          live.push_back({p, n, s});
          addresses << step << ' ' << p << '\n';
        } else if (op < 75) {
          if (live.empty()) continue;
          const size_t i = pick(live.size());
          const size_t s = pick(3) == 0 ? pick(ss.size()) : live[i].stream;
          what = "free #" + std::to_string(i) + " s" + std::to_string(s);
          alloc_->deallocate(live[i].p, ss[s], live[i].n);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        } else if (op < 80) {
          if (live.empty()) continue;
          const size_t i = pick(live.size());
          const size_t s = pick(ss.size());
          what = "record #" + std::to_string(i) + " s" + std::to_string(s);
          alloc_->record_stream(live[i].p, ss[s]);
        } else if (op < 82) {
          const size_t s = 1 + pick(3);
          CurrentPrimary c(t);
          if (capturing[s] != 0) {
            what = "end capture s" + std::to_string(s) + " -> " +
                   std::to_string(static_cast<int>(end_capture(s)));
          } else if (pick(2) == 0) {
            const bool announce = pick(2) == 0;
            if (announce) core::CaptureAnnouncements::begin(primary);
            const CUresult r = t.stream_begin_capture(ss[s], CU_STREAM_CAPTURE_MODE_RELAXED);
            capturing[s] = r != CUDA_SUCCESS ? 0 : announce ? 2 : 1;
            if (r != CUDA_SUCCESS && announce) core::CaptureAnnouncements::end(primary);
            what = std::string("begin capture") + (announce ? " announced" : "") + " s" +
                   std::to_string(s) + " -> " + std::to_string(static_cast<int>(r));
          } else {
            // Destroyed and made again (the sim may recycle the handle value).
            if (held[s]) sim::release_stream(ss[s]);
            held[s] = false;
            auto at = std::find(streams_.begin(), streams_.end(), ss[s]);
            if (at != streams_.end()) streams_.erase(at);
            t.stream_destroy(ss[s]);
            ss[s] = new_stream();
            what = "recreate s" + std::to_string(s);
          }
        } else if (op < 84) {
          if (tc.devices < 2) continue;
          what = "enable_peer_access 1";
          alloc_->enable_peer_access(1);
        } else if (op < 88) {
          const size_t s = 1 + pick(3);
          if (held[s]) {
            sim::release_stream(ss[s]);
          } else {
            sim::hold_stream(ss[s]);
          }
          held[s] = !held[s];
          what = std::string(held[s] ? "hold" : "release") + " s" + std::to_string(s);
        } else if (op < 91) {
          what = "release_cached";
          alloc_->release_cached();
        } else if (op < 94) {
          const size_t lim = pick(3) == 0 ? core::kNoLimit : (256 + pick(768)) * MiB;
          what = "set_limit " + std::to_string(lim);
          alloc_->set_limit(lim);
        } else if (tc.inject) {
          const EntryPoint e = faults[pick(faults.size())];
          const uint64_t nth = 1 + pick(4);
          sim::inject_failure(e, nth, CUDA_ERROR_UNKNOWN);
          what = std::string("inject ") + driver::entry_point_name(e) + " #" + std::to_string(nth);
        } else {
          continue;
        }
        what += " ok";
      } catch (const out_of_memory& e) {
        what += " oom";
        message = e.what();
      } catch (const driver_failure& e) {
        what += " driver_failure";
        message = e.what();
      } catch (const usage_error& e) {
        what += " usage_error";
        message = e.what();
      }
      if (!message.empty()) addresses << step << ' ' << message << '\n';
      const core::DeviceStats st = alloc_->stats();
      out << step << ' ' << what << "\n  " << st.requested_bytes << ' ' << st.allocated_bytes
          << ' ' << st.touched_bytes << ' ' << st.mapped_bytes << ' ' << st.cached_bytes << ' '
          << st.pooled_bytes << ' ' << st.physical_bytes << ' ' << st.va_reserved_bytes << " pk "
          << st.peak_requested_bytes << ' ' << st.peak_allocated_bytes << ' '
          << st.peak_mapped_bytes << ' ' << st.peak_physical_bytes << ' '
          << st.peak_va_reserved_bytes << " n " << st.live_blocks << ' ' << st.num_allocs << ' '
          << st.num_frees << ' ' << st.num_ooms << ' ' << st.num_reclaimed_pages << ' '
          << st.num_created_pages << ' ' << st.num_released_pages << " q " << st.stream_queries
          << " t " << st.tracked_streams << "\n  calls";
      for (int e = 0; e < driver::kEntryPointCount; ++e) {
        const uint64_t c = sim::call_count(static_cast<EntryPoint>(e));
        if (c != 0) out << ' ' << driver::entry_point_name(static_cast<EntryPoint>(e)) << '=' << c;
      }
      out << "\n  books";
      for (size_t i = 0; i < static_cast<size_t>(driver::kEntryPointCount); ++i) {
        if (st.driver_calls[i] != 0) out << ' ' << i << '=' << st.driver_calls[i];
      }
      out << "\n  events " << events.allocs << ' ' << events.frees << ' ' << events.maps << ' '
          << events.unmaps << ' ' << events.ooms << ' ' << events.mapped << ' ' << events.unmapped;
      out << "\n  segments";
      for (const core::SegmentView& sv : alloc_->segments()) {
        addresses << step << " segment " << sv.address << '\n';
        out << ' ' << sv.size << (sv.small_arena ? "s:" : ":");
        for (const core::BlockView& bv : sv.blocks) {
          out << bv.size << '/' << bv.requested << '/' << static_cast<int>(bv.state) << ',';
        }
      }
      const std::string inv = alloc_->check_invariants();
      if (!inv.empty()) out << "\n  INVARIANT " << inv;
      if (step % 50 == 0) {
        const std::string bv = books_vs_driver();
        if (!bv.empty()) out << "\n  BOOKS " << bv;
      }
      out << '\n';
    }
    sim::clear_injections();
    sim::release_all();
    for (size_t s = 0; s < ss.size(); ++s) {
      if (capturing[s] != 0) {
        CurrentPrimary c(t);
        end_capture(s);
      }
    }
    for (const Live& l : live) alloc_->deallocate(l.p, ss[l.stream]);
    alloc_->release_cached();
    out << "end " << books_vs_driver() << '\n';
    alloc_->set_events(nullptr);
    return {out.str() + addresses.str(), out.str()};
  }
};

// The figures of each (config, seed) sequence of 1500 steps, as recorded: fnv1a of
// Trace::figures.
struct Recorded {
  const char* config;
  uint64_t seed;
  uint64_t hash;
};
constexpr size_t kSteps = 1500;
constexpr Recorded kRecorded[] = {
    {"default", 1, 0x391fd2394e725d8cull},
    {"default", 2, 0xd5413c7046316b19ull},
    {"default_inject", 1, 0xb791950e31267063ull},
    {"default_inject", 2, 0x03bcfd7172f2cec0ull},
    {"reclaim_first_inject", 1, 0xd50f850d92716148ull},
    {"reclaim_first_inject", 2, 0x4f476766481a1f64ull},
    {"high_water_threshold_inject", 1, 0xc58fe85959887351ull},
    {"high_water_threshold_inject", 2, 0xfdb17ed9f42a792dull},
    {"page_handles_limit_inject", 1, 0x732395f33848829full},
    {"page_handles_limit_inject", 2, 0xd4e7718271f9d57aull},
    {"small_va_inject", 1, 0x53b83ec11fbce6f7ull},
    {"small_va_inject", 2, 0x19082747bce21901ull},
    {"small_handles", 1, 0x7ae72d625420a439ull},
    {"small_handles", 2, 0x0a92da7f527e31c3ull},
    {"no_stream_ids_inject", 1, 0x7c8bcfa8961af36full},
    {"no_stream_ids_inject", 2, 0xf0548cdca8dd6f3cull},
    {"two_devices_inject", 1, 0x498ed36b59f9d29cull},
    {"two_devices_inject", 2, 0xf9615f18ed1be3e3ull},
};

TEST_F(OperationSequenceTest, FiguresMatchTheRecordedOnes) {
  const char* dir = std::getenv("EXPANSE_OP_TRACE_DIR");
  for (const TraceConfig& tc : trace_configs()) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const Trace trace = run(tc, seed, kSteps);
      const uint64_t hash = fnv1a(trace.figures);
      if (dir != nullptr) {
        std::ofstream(std::string(dir) + "/" + tc.name + "_" + std::to_string(seed) + ".txt")
            << trace.full;
      }
      const Recorded* want = nullptr;
      for (const Recorded& r : kRecorded) {
        if (std::string(r.config) == tc.name && r.seed == seed) want = &r;
      }
      if (want == nullptr || want->hash != hash) {  // the entry kRecorded would hold now
        std::printf("    {\"%s\", %llu, 0x%016llxull},\n", tc.name,
                    static_cast<unsigned long long>(seed), static_cast<unsigned long long>(hash));
      }
      EXPECT_NE(want, nullptr) << tc.name << " seed " << seed << ": no recorded figures";
      EXPECT_EQ(hash, want != nullptr ? want->hash : 0)
          << tc.name << " seed " << seed << ": the figures differ from the recorded ones (write "
          << "both builds' steps with EXPANSE_OP_TRACE_DIR and diff them)";
      EXPECT_EQ(trace.figures.find("INVARIANT"), std::string::npos) << tc.name << " " << seed;
      EXPECT_EQ(trace.figures.find("BOOKS"), std::string::npos) << tc.name << " " << seed;
      TearDown();
    }
  }
}

}  // namespace
}  // namespace expanse::test
