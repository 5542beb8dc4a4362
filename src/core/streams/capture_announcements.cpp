#include "core/streams/capture_announcements.hpp"

#include "core/front/cache_bypass.hpp"

#include <condition_variable>
#include <map>
#include <mutex>

namespace expanse::core {
namespace {

// Per context: captures announced, and syncs running. The lock is held only to read and change
// these, never across a driver call: a sync of one context (seconds of queued work) holds up
// only an announcement in that same context, which must wait for it anyway.
struct Registry {
  std::mutex mu;
  std::condition_variable sync_done;
  struct PerContext {
    int announced = 0;
    int syncing = 0;
  };
  std::map<CUcontext, PerContext> contexts;
  std::multimap<const void*, CUcontext> by_stream;  // begin(ctx, stream), for end_stream()

  void forget_if_idle(std::map<CUcontext, PerContext>::iterator it) {
    if (it->second.announced <= 0 && it->second.syncing <= 0) contexts.erase(it);
  }
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: allocators may sync during exit
  return *r;
}

}  // namespace

void CaptureAnnouncements::begin(CUcontext ctx, const void* stream) {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mu);
  // A sync under way would invalidate the capture about to begin: wait for it to end.
  r.sync_done.wait(lock, [&] {
    auto it = r.contexts.find(ctx);
    return it == r.contexts.end() || it->second.syncing == 0;
  });
  ++r.contexts[ctx].announced;
  r.by_stream.emplace(stream, ctx);
  CacheBypass::enter();  // before the capture can begin: no cached block is handed to it
}

void CaptureAnnouncements::end(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.contexts.find(ctx);
  if (it == r.contexts.end() || it->second.announced <= 0) return;  // end without a begin
  --it->second.announced;
  CacheBypass::leave();
  for (auto s = r.by_stream.begin(); s != r.by_stream.end(); ++s) {
    if (s->second == ctx) {
      r.by_stream.erase(s);
      break;
    }
  }
  r.forget_if_idle(it);
}

bool CaptureAnnouncements::end_stream(const void* stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto s = r.by_stream.find(stream);
  if (s == r.by_stream.end()) return false;
  auto it = r.contexts.find(s->second);
  r.by_stream.erase(s);
  if (it != r.contexts.end() && it->second.announced > 0) {
    --it->second.announced;
    CacheBypass::leave();
    r.forget_if_idle(it);
  }
  return true;
}

int CaptureAnnouncements::count(CUcontext ctx) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.contexts.find(ctx);
  return it == r.contexts.end() ? 0 : it->second.announced;
}

bool CaptureAnnouncements::run_unless_capturing(CUcontext ctx, const std::function<bool()>& op) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto& pc = r.contexts[ctx];
    if (pc.announced > 0) {
      r.forget_if_idle(r.contexts.find(ctx));
      return false;
    }
    ++pc.syncing;  // announcements in ctx wait from here until the op has returned
  }
  bool result = false;
  try {
    result = op();
  } catch (...) {
    result = false;
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.contexts.find(ctx);
    --it->second.syncing;
    r.forget_if_idle(it);
  }
  r.sync_done.notify_all();
  return result;
}

}  // namespace expanse::core
