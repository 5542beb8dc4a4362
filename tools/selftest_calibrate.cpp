#include "selftest_calibrate.hpp"

#include "conf/env_config.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

namespace expanse::tools::selftest {
namespace {

using driver::EntryPoint;
using Clock = std::chrono::steady_clock;

// Seconds one call took; fails the calibration when it fails.
template <class F>
double timed(const Env& e, const std::string& what, F call) {
  const auto t0 = Clock::now();
  const CUresult r = call();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  e.ok(r, what);
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The per-handle curves: one reserve / create / map / set access / unmap / release / free
// cycle per repetition and size.
void per_handle(const Env& e, const CalibrationOptions& o, CostTableSamples& out) {
  const auto sizes = calibration_sizes(e.granularity, o.max_handle, o.budget);
  const EntryPoint order[] = {EntryPoint::mem_address_reserve, EntryPoint::mem_create,
                              EntryPoint::mem_map,             EntryPoint::mem_set_access,
                              EntryPoint::mem_unmap,           EntryPoint::mem_release,
                              EntryPoint::mem_address_free};
  const CUmemAllocationProp prop = e.prop();
  const CUmemAccessDesc rw = e.read_write();
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    const std::string sz = conf::format_size(n);
    if (o.progress) {
      o.progress(0.6 * static_cast<double>(k) / static_cast<double>(sizes.size()),
                 "calibrating " + sz + " handles");
    }
    std::vector<double> t[7];
    for (int rep = 0; rep < o.repetitions; ++rep) {
      CUdeviceptr va = 0;
      CUmemGenericAllocationHandle h{};
      bool reserved = false, created = false, mapped = false;
      try {
        t[0].push_back(timed(e, "cuMemAddressReserve(" + sz + ")",
                             [&] { return e.t.mem_address_reserve(&va, n, 0, 0, 0); }));
        reserved = true;
        t[1].push_back(timed(e, "cuMemCreate(" + sz + ")",
                             [&] { return e.t.mem_create(&h, n, &prop, 0); }));
        created = true;
        t[2].push_back(timed(e, "cuMemMap(" + sz + ")",
                             [&] { return e.t.mem_map(va, n, 0, h, 0); }));
        mapped = true;
        t[3].push_back(timed(e, "cuMemSetAccess(" + sz + ")",
                             [&] { return e.t.mem_set_access(va, n, &rw, 1); }));
        t[4].push_back(timed(e, "cuMemUnmap(" + sz + ")", [&] { return e.t.mem_unmap(va, n); }));
        mapped = false;
        t[5].push_back(timed(e, "cuMemRelease(" + sz + ")", [&] { return e.t.mem_release(h); }));
        created = false;
        t[6].push_back(timed(e, "cuMemAddressFree(" + sz + ")",
                             [&] { return e.t.mem_address_free(va, n); }));
        reserved = false;
      } catch (...) {
        if (mapped) e.t.mem_unmap(va, n);
        if (created) e.t.mem_release(h);
        if (reserved) e.t.mem_address_free(va, n);
        throw;
      }
    }
    for (int i = 0; i < 7; ++i) {
      out.by_bytes[order[i]].push_back({static_cast<double>(n), median(t[i])});
    }
  }
}

// The range curves: `count` mappings of one granularity each, side by side; one cuMemSetAccess
// and one cuMemUnmap over the first n of them, n = 1, 2, 4, ... max_range.
void per_range(const Env& e, const CalibrationOptions& o, CostTableSamples& out) {
  const size_t g = e.granularity;
  size_t count = static_cast<size_t>(std::max(o.max_range, 1));
  count = std::min(count, std::max<size_t>(o.budget / g, 1));
  const CUmemAllocationProp prop = e.prop();
  const CUmemAccessDesc rw = e.read_write();
  out.mapping_bytes = static_cast<double>(g);

  Va va(e, count * g);
  struct Handles {
    const Env& e;
    std::vector<CUmemGenericAllocationHandle> h;
    ~Handles() {
      for (auto x : h) e.t.mem_release(x);
    }
  } hs{e, {}};
  for (size_t i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle h{};
    e.ok(e.t.mem_create(&h, g, &prop, 0), "cuMemCreate(" + conf::format_size(g) + ")");
    hs.h.push_back(h);
  }
  for (size_t n = 1; n <= count; n *= 2) {
    if (o.progress) {
      o.progress(0.6 + 0.4 * static_cast<double>(n) / static_cast<double>(count),
                 "calibrating ranges of " + std::to_string(n) + " mappings");
    }
    std::vector<double> ta, tu;
    for (int rep = 0; rep < o.repetitions; ++rep) {
      size_t mapped = 0;
      try {
        for (; mapped < n; ++mapped) {
          e.ok(e.t.mem_map(va.at(mapped * g), g, 0, hs.h[mapped], 0), "cuMemMap");
        }
        const std::string what = " over " + std::to_string(n) + " mappings";
        ta.push_back(timed(e, "cuMemSetAccess" + what,
                           [&] { return e.t.mem_set_access(va.base(), n * g, &rw, 1); }));
        tu.push_back(timed(e, "cuMemUnmap" + what, [&] { return e.t.mem_unmap(va.base(), n * g); }));
        mapped = 0;
      } catch (...) {
        for (size_t i = 0; i < mapped; ++i) e.t.mem_unmap(va.at(i * g), g);
        throw;
      }
    }
    out.by_mappings[EntryPoint::mem_set_access].push_back({static_cast<double>(n), median(ta)});
    out.by_mappings[EntryPoint::mem_unmap].push_back({static_cast<double>(n), median(tu)});
  }
}

}  // namespace

std::vector<size_t> calibration_sizes(size_t g, size_t max_handle, size_t budget) {
  std::vector<size_t> out;
  const size_t top = std::min(max_handle, budget) / g * g;
  for (size_t n = g; n < top; n *= 4) out.push_back(n);
  if (top >= g) out.push_back(top);
  return out;
}

CostTableSamples calibrate(const Env& e, const CalibrationOptions& o) {
  CostTableSamples out;
  per_handle(e, o, out);
  per_range(e, o, out);
  return out;
}

}  // namespace expanse::tools::selftest
