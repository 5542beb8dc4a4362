#include "core/front/cache_bypass.hpp"

#include <atomic>

namespace expanse::core {
namespace {

// Trivially destructible: usable by allocators and thread exits during process exit.
std::atomic<int> g_active{0};

}  // namespace

void CacheBypass::enter() noexcept { g_active.fetch_add(1, std::memory_order_seq_cst); }

void CacheBypass::leave() noexcept { g_active.fetch_sub(1, std::memory_order_seq_cst); }

bool CacheBypass::active() noexcept { return g_active.load(std::memory_order_seq_cst) != 0; }

}  // namespace expanse::core
