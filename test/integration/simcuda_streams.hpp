// Real (simulated) CUDA streams for integration tests.
//
// An application that uses expanse on a GPU shares libcuda.so.1 with expanse: its streams come
// from the same driver that expanse records events on. Tests reproduce that without a GPU by
// loading libexpanse_simcuda.so (the sim under libcuda's symbol names) with dlopen and pointing
// expanse at the same file (EXPANSE_CONF driver:cuda,driver_library:<path>): dlopen of one path
// gives one instance, so streams created here are valid in expanse's driver too.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <string>

namespace expanse_test {

class SimCuda {
 public:
  explicit SimCuda(const std::string& path) : path_(path) {
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* e = dlerror();
      error_ = "dlopen " + path + ": " + (e != nullptr ? e : "failed");
    }
  }
  ~SimCuda() {
    if (lib_ != nullptr) dlclose(lib_);
  }
  SimCuda(const SimCuda&) = delete;
  SimCuda& operator=(const SimCuda&) = delete;

  bool ok() const { return lib_ != nullptr && error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

  // A fresh sim ("sim_capacity:1GiB,sim_devices:2", EXPANSE_CONF syntax). 0 on success.
  int configure(const std::string& conf) {
    auto f = fn<int (*)(const char*)>("expanse_sim_configure");
    return f == nullptr ? -1 : f(conf.c_str());
  }

  // cuInit, device 0's primary context made current on this thread, then cuStreamCreate.
  CUstream create_stream() {
    auto init = fn<CUresult (*)(unsigned)>("cuInit");
    auto device_get = fn<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
    auto retain = fn<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain");
    auto set_current = fn<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
    auto create = fn<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate");
    if (init == nullptr || device_get == nullptr || retain == nullptr || set_current == nullptr ||
        create == nullptr) {
      return nullptr;
    }
    CUdevice dev = 0;  // the CUdevice of ordinal 0 (not 0 itself in the sim)
    CUcontext ctx = nullptr;
    CUstream s = nullptr;
    if (init(0) != CUDA_SUCCESS || device_get(&dev, 0) != CUDA_SUCCESS ||
        retain(&ctx, dev) != CUDA_SUCCESS ||
        set_current(ctx) != CUDA_SUCCESS || create(&s, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
      error_ = "creating a sim stream failed";
      return nullptr;
    }
    return s;
  }

  // Work recorded on a held stream stays pending until release (or a synchronize).
  void hold(CUstream s) { call_void("expanse_sim_hold_stream", s); }
  void release(CUstream s) { call_void("expanse_sim_release_stream", s); }
  unsigned long long pending_events() {
    auto f = fn<unsigned long long (*)()>("expanse_sim_pending_events");
    return f == nullptr ? 0 : f();
  }

 private:
  template <typename F>
  F fn(const char* name) {
    if (lib_ == nullptr) return nullptr;
    void* sym = dlsym(lib_, name);
    if (sym == nullptr) {
      error_ = std::string("dlsym ") + name + ": not found in " + path_;
      return nullptr;
    }
    F out = nullptr;
    static_assert(sizeof(out) == sizeof(sym), "function and object pointers differ in size");
    __builtin_memcpy(&out, &sym, sizeof(out));
    return out;
  }
  void call_void(const char* name, CUstream s) {
    auto f = fn<void (*)(void*)>(name);
    if (f != nullptr) f(static_cast<void*>(s));
  }

  std::string path_;
  void* lib_ = nullptr;
  std::string error_;
};

}  // namespace expanse_test
