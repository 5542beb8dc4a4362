#include "core/capture_announcements.hpp"

#include <map>
#include <mutex>

namespace expanse::core {
namespace {

struct Registry {
  std::mutex mu;  // held across a context sync: no announcement slips in between check and sync
  std::map<CUcontext, int> counts;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: allocators may sync during exit
  return *r;
}

}  // namespace

void CaptureAnnouncements::begin(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.counts[ctx];
}

void CaptureAnnouncements::end(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.counts.find(ctx);
  if (it == r.counts.end()) return;  // an end without a begin changes nothing
  if (--it->second <= 0) r.counts.erase(it);
}

int CaptureAnnouncements::count(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.counts.find(ctx);
  return it == r.counts.end() ? 0 : it->second;
}

bool CaptureAnnouncements::run_unless_capturing(CUcontext ctx, const std::function<bool()>& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.counts.count(ctx) != 0) return false;
  return op();
}

}  // namespace expanse::core
