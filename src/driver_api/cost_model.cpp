#include "driver_api/cost_model.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

namespace expanse::driver {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kBookkeepingNs = 500;  // context/attribute queries: ~0.5 us

// Published H100 80GB measurements: ovg-project/kvcached,
// benchmarks/bench_layout/H100_results.md (CUPTI totals divided by call counts, 2 MiB and
// 112 MiB handles), fitted linearly. Entry points nobody has published for an H100 keep the
// order of the A100 / NCCL bench_vmm figures beside them.
CostModel make_h100() {
  CostModel m;
  m.set_linear(EntryPoint::mem_create, 28000, 240);     // 28 us + 0.24 us/MiB
  m.set_linear(EntryPoint::mem_set_access, 59000, 180); // 59 us + 0.18 us/MiB
  m.set_linear(EntryPoint::mem_unmap, 41000, 170);      // 41 us + 0.17 us/MiB
  m.set_linear(EntryPoint::mem_map, 3300, 15);          // 3.3 us + 0.015 us/MiB
  // cuMemRelease: 23 us at 2 MiB, ~67 us at 112 MiB.
  m.set_samples(EntryPoint::mem_release, {{2 * kMiB, 23000}, {112 * kMiB, 67000}});
  m.set_flat(EntryPoint::mem_address_reserve, 19000);  // A100, 8 GiB reservation
  m.set_flat(EntryPoint::mem_address_free, 19000);     // unmeasured: assume reserve's order
  m.set_flat(EntryPoint::get_error_name, 100);
  m.set_flat(EntryPoint::get_error_string, 100);
  m.set_flat(EntryPoint::driver_get_version, 100);
  m.set_flat(EntryPoint::init, 1000);
  m.set_flat(EntryPoint::mem_get_info, 10000);
  m.set_flat(EntryPoint::ctx_synchronize, 10000);
  m.set_flat(EntryPoint::stream_synchronize, 5000);
  m.set_flat(EntryPoint::event_synchronize, 5000);
  m.set_flat(EntryPoint::stream_query, 1000);
  m.set_flat(EntryPoint::event_query, 1000);
  m.set_flat(EntryPoint::event_record, 2000);
  m.set_flat(EntryPoint::stream_wait_event, 1000);
  m.set_flat(EntryPoint::stream_create, 1000);
  m.set_flat(EntryPoint::stream_destroy, 1000);
  m.set_flat(EntryPoint::event_create, 1000);
  m.set_flat(EntryPoint::event_destroy, 1000);
  // Small synchronous copies: launch and synchronization dominate (~10 us, unmeasured).
  m.set_flat(EntryPoint::memcpy_htod, 10000);
  m.set_flat(EntryPoint::memcpy_dtoh, 10000);
  // Host <-> device copies on a stream, pinned host memory: ~4 us to enqueue (an estimate, of
  // the order of a kernel launch) plus the bytes at 25 GB/s (41.9 us/MiB). 25 GB/s is an
  // estimate for an H100 on PCIe Gen5 x16 (64 GB/s per direction on paper), conservative on
  // purpose; on a GH200 over NVLink-C2C a pinned 1 GiB cuMemcpyHtoD ran at ~97 GiB/s
  // (vortex-data/vortex PR #7815), about 4x faster. The model prices one call as the time its
  // bytes keep a copy engine busy, not the host time of an asynchronous call.
  constexpr double kPinnedCopyNsPerMiB = kMiB / 25e9 * 1e9;
  m.set_linear(EntryPoint::memcpy_htod_async, 4000, kPinnedCopyNsPerMiB);
  m.set_linear(EntryPoint::memcpy_dtoh_async, 4000, kPinnedCopyNsPerMiB);
  // cuMemsetD8Async: ~3 us to enqueue (estimate) plus the bytes at ~2 TB/s of HBM3 write
  // bandwidth (H100 SXM: 3.35 TB/s peak; 2 TB/s achieved is an estimate): 0.52 us/MiB.
  m.set_linear(EntryPoint::memset_d8_async, 3000, kMiB / 2e12 * 1e9);
  // cuMemHostAlloc: pinning is slow. CuPy's pinned allocation of 32 MB took 11.6 ms where a
  // pageable bytearray took 1.4 ms (rapidsai/dask-cuda#106): ~0.36 ms/MiB, plus ~20 us per call
  // (estimate). cuMemFreeHost: unpinning and unmapping, ~10 us + 20 us/MiB (estimate).
  m.set_linear(EntryPoint::mem_host_alloc, 20000, 360000);
  m.set_linear(EntryPoint::mem_free_host, 10000, 20000);
  // cuMemHostRegister / cuMemHostUnregister: pinning and unpinning pages the process already
  // mapped, priced as cuMemHostAlloc and cuMemFreeHost (estimate).
  m.set_linear(EntryPoint::mem_host_register, 10000, 360000);
  m.set_linear(EntryPoint::mem_host_unregister, 10000, 20000);
  return m;
}

std::atomic<const CostModel*>& default_slot() {
  static std::atomic<const CostModel*> slot{&CostModel::h100()};
  return slot;
}

void check_samples(const std::vector<CostSample>& s, EntryPoint e) {
  for (const CostSample& c : s) {
    if (!(c.x >= 0) || !(c.ns >= 0))
      throw std::invalid_argument(std::string("cost model: ") + entry_point_name(e) +
                                  ": samples need x >= 0 and ns >= 0");
  }
}

}  // namespace

double interpolate(const std::vector<CostSample>& s, double x) noexcept {
  if (s.empty()) return 0;
  if (s.size() == 1) return s.front().ns;
  // The segment [i-1, i] that holds x, or the first / last segment beyond the ends.
  size_t i = 1;
  while (i + 1 < s.size() && s[i].x < x) ++i;
  const CostSample& a = s[i - 1];
  const CostSample& b = s[i];
  if (b.x <= a.x) return std::max(0.0, b.ns);
  const double ns = a.ns + (b.ns - a.ns) * (x - a.x) / (b.x - a.x);
  return std::max(0.0, ns);
}

CostModel::CostModel() {
  for (auto& s : by_bytes_) s = {{0, kBookkeepingNs}};
  for (double& b : range_bytes_) b = -1;
}

const CostModel& CostModel::h100() noexcept {
  static const CostModel m = make_h100();
  return m;
}

const CostModel& CostModel::get_default() noexcept { return *default_slot().load(); }

void CostModel::set_default(const CostModel& m) {
  // Models installed are kept for the life of the process: a reader may still hold the old one.
  static std::vector<std::unique_ptr<CostModel>> kept;
  kept.push_back(std::make_unique<CostModel>(m));
  default_slot().store(kept.back().get());
}

double CostModel::cost_ns(EntryPoint e, size_t bytes, size_t mappings) const noexcept {
  const int i = static_cast<int>(e);
  const double m = static_cast<double>(std::max<size_t>(mappings, 1));
  const double per_handle = static_cast<double>(bytes) / m;
  const auto& bb = by_bytes_[i];
  const auto& rm = by_mappings_[i];
  if (rm.empty() || mappings <= 1) return m * interpolate(bb, per_handle);
  // Range curve measured with mappings of range_bytes_ (by default the smallest sampled handle
  // size); larger handles add their per-byte part on top, once per mapping.
  const double smallest = range_bytes_[i] >= 0 ? range_bytes_[i] : bb.empty() ? 0 : bb.front().x;
  const double extra = std::max(0.0, interpolate(bb, per_handle) - interpolate(bb, smallest));
  return interpolate(rm, m) + m * extra;
}

void CostModel::set_flat(EntryPoint e, double ns) { set_samples(e, {{0, ns}}); }

void CostModel::set_linear(EntryPoint e, double per_call_ns, double per_mib_ns) {
  set_samples(e, {{0, per_call_ns}, {kMiB, per_call_ns + per_mib_ns}});
}

void CostModel::set_samples(EntryPoint e, std::vector<CostSample> s) {
  check_samples(s, e);
  std::sort(s.begin(), s.end(), [](const CostSample& a, const CostSample& b) { return a.x < b.x; });
  by_bytes_[static_cast<int>(e)] = std::move(s);
}

void CostModel::set_range_samples(EntryPoint e, std::vector<CostSample> s) {
  check_samples(s, e);
  std::sort(s.begin(), s.end(), [](const CostSample& a, const CostSample& b) { return a.x < b.x; });
  by_mappings_[static_cast<int>(e)] = std::move(s);
  range_bytes_[static_cast<int>(e)] = -1;
}

void CostModel::set_range_samples(EntryPoint e, std::vector<CostSample> s, double mapping_bytes) {
  if (!(mapping_bytes >= 0)) {
    throw std::invalid_argument(std::string("cost model: ") + entry_point_name(e) +
                                ": mapping_bytes must be >= 0");
  }
  set_range_samples(e, std::move(s));
  range_bytes_[static_cast<int>(e)] = mapping_bytes;
}

}  // namespace expanse::driver
