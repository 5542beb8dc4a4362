// TEMPORARY development instrumentation (not to be committed).
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
namespace expanse::core::dbg {
enum Counter { split_n, split_pages, exch_large_n, exch_large_pages, exch_small_n, exch_small_pages,
  create_n, create_pages, extra_create_n, extra_create_pages, reclaim_n, reclaim_pages,
  place_ready, place_mapped, place_tight, place_fresh, place_echo, place_recent, blocked_n, kCount };
inline const char* names[] = {"split_n","split_pages","exch_large_n","exch_large_pages","exch_small_n","exch_small_pages",
  "create_n","create_pages","extra_create_n","extra_create_pages","reclaim_n","reclaim_pages",
  "place_ready","place_mapped","place_tight","place_fresh","place_echo","place_recent","blocked_n"};
struct Counters {
  std::atomic<uint64_t> v[kCount]{};
  Counters() { if (std::getenv("EXPANSE_DEBUG_COUNTERS")) std::atexit([]{ print(); }); }
  static void print();
};
inline Counters& get() { static Counters c; return c; }
inline void Counters::print() { for (int i=0;i<kCount;++i) std::fprintf(stderr, "%s=%llu ", names[i], static_cast<unsigned long long>(get().v[i].load())); std::fprintf(stderr,"\n"); }
inline void add(Counter c, uint64_t n = 1) { get().v[c] += n; }
}
