#include "driver/cost_model.hpp"

namespace expanse::driver {
namespace {

CostModel make_a100() {
  CostModel m;
  for (double& c : m.per_call_ns) c = 500;  // bookkeeping calls: ~0.5 us
  auto set = [&m](EntryPoint e, double ns, bool per_page) {
    m.per_call_ns[static_cast<int>(e)] = ns;
    m.per_page[static_cast<int>(e)] = per_page;
  };
  set(EntryPoint::get_error_name, 100, false);
  set(EntryPoint::get_error_string, 100, false);
  set(EntryPoint::driver_get_version, 100, false);
  set(EntryPoint::init, 1000, false);
  set(EntryPoint::mem_address_reserve, 20000, false);
  set(EntryPoint::mem_address_free, 20000, false);  // unmeasured: assume reserve's order
  set(EntryPoint::mem_create, 193000, true);
  set(EntryPoint::mem_release, 26000, false);  // unmeasured: assume unmap's order
  set(EntryPoint::mem_map, 1500, true);
  set(EntryPoint::mem_unmap, 26000, true);
  set(EntryPoint::mem_set_access, 36000, true);  // per page per descriptor
  set(EntryPoint::mem_get_info, 10000, false);
  set(EntryPoint::ctx_synchronize, 10000, false);
  set(EntryPoint::stream_synchronize, 5000, false);
  set(EntryPoint::event_synchronize, 5000, false);
  set(EntryPoint::stream_query, 1000, false);
  set(EntryPoint::event_query, 1000, false);
  set(EntryPoint::event_record, 2000, false);
  set(EntryPoint::stream_wait_event, 1000, false);
  set(EntryPoint::stream_create, 1000, false);
  set(EntryPoint::stream_destroy, 1000, false);
  set(EntryPoint::event_create, 1000, false);
  set(EntryPoint::event_destroy, 1000, false);
  // Small synchronous copies (a word to a few KiB): dominated by launch and synchronization,
  // ~10 us per call whatever the size (unmeasured: the order of a pageable cudaMemcpy).
  set(EntryPoint::memcpy_htod, 10000, false);
  set(EntryPoint::memcpy_dtoh, 10000, false);
  return m;
}

}  // namespace

const CostModel& CostModel::a100() noexcept {
  static const CostModel m = make_a100();
  return m;
}

}  // namespace expanse::driver
