#include "workloads/reserve_probe.hpp"

#include "conf/env_config.hpp"
#include "core/device_allocator.hpp"
#include "expanse/errors.hpp"

namespace expanse::replay {

ReserveProbe probe_reservation(const driver::LoadedDriver& drv, int device,
                               const conf::Config& conf, size_t capacity) {
  ReserveProbe p;
  const conf::AllocatorOptions o = conf::options_for_device(conf, capacity);
  if (!o.reserve_free && o.reserve_bytes == 0) return p;
  if (o.reserve_free) {
    p.spec = "free less " + conf::format_size(o.reserve_margin);
  } else if (conf.reserve_fraction > 0) {
    p.spec = std::to_string(static_cast<int>(conf.reserve_fraction * 100 + 0.5)) +
             "% of the capacity";
  } else {
    p.spec = conf::format_size(o.reserve_bytes);
  }
  try {
    core::DeviceAllocator a(drv, device, o);
    a.reserve(o.reserve_free ? core::DeviceAllocator::kReserveFree : o.reserve_bytes);
    const core::DeviceAllocator::ReserveState s = a.reservation();
    p.asked_bytes = s.asked_bytes;
    p.held_bytes = s.reserved_bytes;
  } catch (const std::exception& e) {
    p.error = e.what();
  }
  return p;
}

}  // namespace expanse::replay
