#include "driver/driver_trace.hpp"

#include "driver/driver.hpp"

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <string>
#include <type_traits>

namespace expanse::driver {
namespace {

std::atomic<int> g_mode{0};

template <typename T>
uint64_t as_u64(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<uintptr_t>(v);
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    return static_cast<uint64_t>(v);
  } else {
    return 0;  // a struct passed by value: not shown
  }
}

template <typename... A>
uint64_t first_arg(A... a) {
  if constexpr (sizeof...(A) == 0) {
    return 0;
  } else {
    uint64_t v[] = {as_u64(a)...};
    return v[0];
  }
}

unsigned long thread_tag() { return static_cast<unsigned long>(pthread_self()) & 0xffffffUL; }

template <int I, typename F>
struct Traced;

template <int I, typename... A>
struct Traced<I, CUresult(CUDAAPI*)(A...)> {
  static inline CUresult(CUDAAPI* real)(A...) = nullptr;
  static CUresult CUDAAPI call(A... a) {
    const auto e = static_cast<EntryPoint>(I);
    const int mode = g_mode.load(std::memory_order_relaxed);
    if (mode == static_cast<int>(TraceMode::all)) {
      std::fprintf(stderr, "[expanse driver] %06lx %s(0x%" PRIx64 ")\n", thread_tag(),
                   entry_point_name(e), first_arg(a...));
    }
    const CUresult r = real(a...);
    if (r != CUDA_SUCCESS && !(r == CUDA_ERROR_NOT_READY && mode != static_cast<int>(TraceMode::all))) {
      std::fprintf(stderr, "[expanse driver] %06lx %s(0x%" PRIx64 ") -> %d\n", thread_tag(),
                   entry_point_name(e), first_arg(a...), static_cast<int>(r));
    }
    return r;
  }
};

}  // namespace

TraceMode trace_mode_from_env() {
  const char* v = std::getenv("EXPANSE_DRIVER_TRACE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "off") == 0) return TraceMode::off;
  if (std::strcmp(v, "errors") == 0) return TraceMode::errors;
  if (std::strcmp(v, "all") == 0) return TraceMode::all;
  throw driver_error(std::string("EXPANSE_DRIVER_TRACE: '") + v +
                         "' is not one of off, errors, all",
                     CUDA_ERROR_INVALID_VALUE);
}

DriverTable traced_table(const DriverTable& real, TraceMode mode) {
  g_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
  if (mode == TraceMode::off) return real;
  DriverTable out = real;
#define EXPANSE_X(field, base, symbol, ...)                                                 \
  if (real.field != nullptr) {                                                              \
    using T = Traced<static_cast<int>(EntryPoint::field), decltype(&::symbol)>;             \
    T::real = real.field;                                                                   \
    out.field = &T::call;                                                                   \
  }
  EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
  return out;
}

}  // namespace expanse::driver
