// libexpanse.so driven the way PyTorch's CUDAPluggableAllocator drives it.
//
// torch.cuda.memory.CUDAPluggableAllocator("libexpanse.so", "expanse_malloc", "expanse_free")
// loads the library (ctypes.CDLL: dlopen), looks both functions up by name and calls them as
//   void* alloc(size_t size, int device, cudaStream_t stream)
//   void  free(void* ptr, size_t size, int device, cudaStream_t stream)
// handing free back the size, device and stream it recorded at allocation. It does not check
// alloc's result for NULL before using it, never calls record_stream, empty_cache or stats on
// a pluggable allocator, and may call from several threads. This test does the same: it does not
// link libexpanse (only dlopen/dlsym), configures it only through EXPANSE_CONF, and checks the
// contract PyTorch relies on.
#include "expanse/expanse.h"  // expanse_stats, for the checks made through dlsym as ctypes would
#include "simcuda_streams.hpp"

#include <cuda_runtime_api.h>  // cudaStream_t: the type PyTorch passes
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// The exact function types of torch/csrc/cuda/CUDAPluggableAllocator.h.
using alloc_fn_t = void* (*)(size_t size, int device, cudaStream_t stream);
using free_fn_t = void (*)(void* ptr, size_t size, int device, cudaStream_t stream);

template <typename F>
F lookup(void* lib, const char* name) {
  void* sym = dlsym(lib, name);
  F out = nullptr;
  if (sym != nullptr) std::memcpy(&out, &sym, sizeof(out));
  return out;
}

// libexpanse.so as a Python process would have it after CUDAPluggableAllocator(...), plus the
// extra entry points a user would reach through ctypes.CDLL("libexpanse.so").
struct Expanse {
  void* lib = nullptr;
  alloc_fn_t alloc = nullptr;
  free_fn_t free = nullptr;
  int (*get_stats)(int, expanse_stats*) = nullptr;
  int (*release_cached)(int) = nullptr;
  int (*init)(const char*) = nullptr;
  const char* (*last_error)() = nullptr;
  const char* (*driver_description)() = nullptr;
  std::string error;

  Expanse() {
    // PyTorch users set EXPANSE_CONF before the first CUDA allocation; so does this test (ctest
    // sets it too; keep what it set).
    setenv("EXPANSE_CONF", "driver:sim,sim_capacity:1GiB", 0);
    lib = dlopen(EXPANSE_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      error = dlerror();
      return;
    }
    alloc = lookup<alloc_fn_t>(lib, "expanse_malloc");
    free = lookup<free_fn_t>(lib, "expanse_free");
    get_stats = lookup<decltype(get_stats)>(lib, "expanse_get_stats");
    release_cached = lookup<decltype(release_cached)>(lib, "expanse_release_cached");
    init = lookup<decltype(init)>(lib, "expanse_init");
    last_error = lookup<decltype(last_error)>(lib, "expanse_last_error");
    driver_description = lookup<decltype(driver_description)>(lib, "expanse_driver_description");
  }

  expanse_stats stats(int device = 0) const {
    expanse_stats s{};
    s.struct_size = sizeof(s);
    EXPECT_EQ(get_stats(device, &s), EXPANSE_OK) << last_error();
    return s;
  }
};

Expanse& expanse() {
  static Expanse e;
  return e;
}

class PyTorchAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Expanse& e = expanse();
    ASSERT_NE(e.lib, nullptr) << e.error;
    ASSERT_NE(e.alloc, nullptr);
    ASSERT_NE(e.free, nullptr);
    ASSERT_NE(e.get_stats, nullptr);
    ASSERT_NE(e.release_cached, nullptr);
    ASSERT_NE(e.init, nullptr);
    ASSERT_NE(e.last_error, nullptr);
  }
  void TearDown() override { EXPECT_EQ(expanse().stats().live_blocks, 0u) << "a test leaked blocks"; }

  static Expanse& ex() { return expanse(); }
};

// The symbols PyTorch looks up exist, with C linkage, in the dynamic symbol table.
TEST_F(PyTorchAbiTest, SymbolsResolveByName) {
  Dl_info info{};
  void* sym = dlsym(ex().lib, "expanse_malloc");
  ASSERT_NE(sym, nullptr);
  ASSERT_NE(dladdr(sym, &info), 0);
  EXPECT_STREQ(info.dli_sname, "expanse_malloc");
  const char* desc = ex().driver_description();
  ASSERT_NE(desc, nullptr);
  EXPECT_EQ(std::string(desc).rfind("sim:", 0), 0u) << desc;
}

TEST_F(PyTorchAbiTest, ZeroBytesIsNull) {
  EXPECT_EQ(ex().alloc(0, 0, nullptr), nullptr);
  ex().free(nullptr, 0, 0, nullptr);  // PyTorch may hand NULL back
  EXPECT_EQ(ex().stats().live_blocks, 0u);
}

// A training-step-like mix: tensors of many sizes, allocated and freed out of order, each freed
// with the size, device and stream it was allocated with. Every tensor keeps its bytes.
TEST_F(PyTorchAbiTest, ManyTensorsOfVariedSizes) {
  struct Tensor {
    void* ptr;
    size_t size;
    unsigned char fill;
  };
  std::mt19937_64 rng(2024);
  std::vector<Tensor> live;
  const auto s0 = ex().stats();
  size_t allocs = 0;
  for (int step = 0; step < 3000; ++step) {
    const bool do_alloc = live.empty() || (rng() % 100) < 55;
    if (do_alloc && live.size() < 200) {
      size_t size = 0;
      switch (rng() % 4) {
        case 0: size = 1 + rng() % 512; break;                   // scalars, small tensors
        case 1: size = 512 * (1 + rng() % 2048); break;          // activations
        case 2: size = (size_t{1} << 20) * (1 + rng() % 4); break;  // weights, grads
        default: size = 1 + rng() % (size_t{3} << 20); break;    // odd sizes
      }
      void* p = ex().alloc(size, 0, nullptr);
      ASSERT_NE(p, nullptr) << "step " << step << ": " << ex().last_error();
      const auto fill = static_cast<unsigned char>(rng());
      std::memset(p, fill, size);
      live.push_back({p, size, fill});
      ++allocs;
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      const Tensor t = live[i];
      const auto* b = static_cast<const unsigned char*>(t.ptr);
      for (size_t off : {size_t{0}, t.size / 2, t.size - 1}) {
        ASSERT_EQ(b[off], t.fill) << "tensor of " << t.size << " bytes changed at " << off;
      }
      ex().free(t.ptr, t.size, 0, nullptr);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (const Tensor& t : live) ex().free(t.ptr, t.size, 0, nullptr);
  const auto s1 = ex().stats();
  EXPECT_EQ(s1.live_blocks, 0u);
  EXPECT_EQ(s1.num_allocs - s0.num_allocs, allocs);
  EXPECT_EQ(s1.num_frees - s0.num_frees, allocs) << "a free with PyTorch's arguments was refused";
}

// OOM: PyTorch turns NULL into its OutOfMemoryError; it must be NULL, not a crash or exception,
// and later allocations must work.
TEST_F(PyTorchAbiTest, OutOfMemoryIsNull) {
  EXPECT_EQ(ex().alloc(size_t{4} << 30, 0, nullptr), nullptr);
  EXPECT_NE(std::string(ex().last_error()).find("out of"), std::string::npos) << ex().last_error();
  EXPECT_EQ(ex().alloc(SIZE_MAX, 0, nullptr), nullptr);
  void* p = ex().alloc(size_t{512} << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << ex().last_error();
  ex().free(p, size_t{512} << 20, 0, nullptr);
  EXPECT_GE(ex().stats().num_ooms, 1u);
}

TEST_F(PyTorchAbiTest, BadDeviceIsNullNotACrash) {
  EXPECT_EQ(ex().alloc(1024, 7, nullptr), nullptr);
  EXPECT_EQ(ex().alloc(1024, -1, nullptr), nullptr);
  EXPECT_NE(std::string(ex().last_error()), "");
}

// torch.cuda.empty_cache() does not reach a pluggable allocator; ctypes can call
// expanse_release_cached(device) instead.
TEST_F(PyTorchAbiTest, ReleaseCachedThroughCtypesStyleCall) {
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(ex().alloc(size_t{8} << 20, 0, nullptr));
  for (void* p : ps) ex().free(p, size_t{8} << 20, 0, nullptr);
  EXPECT_GT(ex().stats().mapped_bytes, 0u);
  EXPECT_EQ(ex().release_cached(0), EXPANSE_OK);
  EXPECT_EQ(ex().stats().mapped_bytes, 0u);
  EXPECT_EQ(ex().stats().physical_bytes, 0u);
}

// Several threads allocate and free at once (autograd runs one thread per device; user threads
// may add more).
TEST_F(PyTorchAbiTest, ConcurrentThreads) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, size_t>> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.size() < 32 && (rng() % 2 == 0 || mine.empty())) {
          const size_t size = 256 + rng() % (256 * 1024);
          void* p = expanse().alloc(size, 0, nullptr);
          if (p == nullptr) {
            ++failures[static_cast<size_t>(t)];
            continue;
          }
          static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(t);
          mine.emplace_back(p, size);
        } else {
          auto [p, size] = mine.back();
          mine.pop_back();
          if (static_cast<unsigned char*>(p)[0] != static_cast<unsigned char>(t)) {
            ++failures[static_cast<size_t>(t)];
          }
          expanse().free(p, size, 0, nullptr);
        }
      }
      for (auto [p, size] : mine) expanse().free(p, size, 0, nullptr);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], 0) << "thread " << t;
}

// With PyTorch on a GPU, expanse and the CUDA runtime share libcuda.so.1, and PyTorch passes
// its current stream (a real cudaStream_t) to malloc and free. Here both share
// libexpanse_simcuda.so. PyTorch frees a block on the stream it was allocated on (it never
// calls record_stream on a pluggable allocator); memory freed on a stream with pending work goes
// back to that stream at once, to other streams only once the work is done.
TEST_F(PyTorchAbiTest, RealStreamsFromTheSameDriver) {
  expanse_test::SimCuda sim(EXPANSE_SIMCUDA_PATH);
  ASSERT_TRUE(sim.ok()) << sim.error();
  ASSERT_EQ(sim.configure("sim_capacity:1GiB"), 0);
  cudaStream_t s1 = sim.create_stream();
  cudaStream_t s2 = sim.create_stream();
  ASSERT_NE(s1, nullptr) << sim.error();
  ASSERT_NE(s2, nullptr) << sim.error();
  // What a user's EXPANSE_CONF would say; expanse_init stands in for a fresh process.
  const std::string conf = std::string("driver:cuda,driver_library:") + sim.path();
  ASSERT_EQ(ex().init(conf.c_str()), EXPANSE_OK) << ex().last_error();
  EXPECT_EQ(std::string(ex().driver_description()).rfind("cuda: ", 0), 0u);

  const size_t n = size_t{6} << 20;
  sim.hold(s1);  // kernels on s1 still running
  void* a = ex().alloc(n, 0, s1);
  ASSERT_NE(a, nullptr) << ex().last_error();
  ex().free(a, n, 0, s1);
  void* b = ex().alloc(n, 0, s2);
  ASSERT_NE(b, nullptr) << ex().last_error();
  EXPECT_NE(b, a) << "memory freed on a busy stream went to another stream";
  void* c = ex().alloc(n, 0, s1);
  ASSERT_NE(c, nullptr) << ex().last_error();
  ex().free(b, n, 0, s2);
  ex().free(c, n, 0, s1);
  sim.release(s1);
  EXPECT_EQ(ex().stats().live_blocks, 0u);

  // Back to the configuration of the other tests.
  const char* env = getenv("EXPANSE_CONF");
  ASSERT_EQ(ex().init(env != nullptr ? env : ""), EXPANSE_OK) << ex().last_error();
}

}  // namespace
