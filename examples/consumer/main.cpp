// A minimal expanse application: the C++ API and the C ABI, from an installed package.
// On the sim (EXPANSE_CONF=driver:sim) device memory is host memory, so it also writes and reads
// the blocks; on a GPU it only allocates and frees.
#include <expanse/expanse.h>
#include <expanse/expanse.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

// The file libexpanse was loaded from (Linux: /proc/self/maps).
static std::string loaded_library() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto at = line.find('/');
    if (at != std::string::npos && line.find("libexpanse.so") != std::string::npos) {
      return line.substr(at);
    }
  }
  return "unknown";
}

int main() {
  try {
    const std::string driver = expanse::driver_description();
    const bool host_accessible = driver.rfind("sim:", 0) == 0;
    std::printf("driver: %s\nlibrary: %s\n", driver.c_str(), loaded_library().c_str());

    // C++ API: exceptions on failure.
    expanse::device_allocator gpu0(0);
    const size_t n = size_t{64} << 20;
    void* big = gpu0.allocate(n);  // default stream
    if (host_accessible) std::memset(big, 0x2a, n);

    // C ABI: NULL and expanse_last_error() on failure.
    void* small = expanse_malloc(1000, 0, nullptr);
    if (small == nullptr) {
      std::fprintf(stderr, "expanse_malloc: %s\n", expanse_last_error());
      return 1;
    }
    if (host_accessible) std::memset(small, 1, 1000);
    const bool intact = !host_accessible || static_cast<unsigned char*>(big)[n - 1] == 0x2a;

    expanse::Stats s = gpu0.stats();
    std::printf("live blocks %llu, requested %llu B, mapped %llu B\n",
                static_cast<unsigned long long>(s.live_blocks),
                static_cast<unsigned long long>(s.requested_bytes),
                static_cast<unsigned long long>(s.mapped_bytes));
    expanse_free(small, 1000, 0, nullptr);
    gpu0.deallocate(big);
    if (!intact || s.live_blocks != 2 || gpu0.stats().live_blocks != 0) {
      std::fprintf(stderr, "expanse_consumer: unexpected state\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_consumer: %s\n", e.what());
    return 1;
  }
  std::printf("expanse_consumer: ok\n");
  return 0;
}
