// The software driver's options as EXPANSE_CONF sets them (the sim_* keys): a plain struct and its
// parser, below every layer, so that the library checks a whole EXPANSE_CONF string when it reads
// it (conf/config.hpp) without calling into the sim.
#pragma once

#include <cstddef>
#include <string>

namespace expanse::conf {

inline constexpr int kMaxSimDevices = 64;

struct SimOptions {
  int devices = 1;
  size_t capacity = size_t{80} << 30;    // physical bytes per device
  size_t granularity = size_t{2} << 20;  // minimum == recommended granularity
  // false: physical pages have no host memory behind them and mapped VA stays PROT_NONE, so a
  // trace peaking at 55 GiB replays on a small host (replay never touches the memory).
  bool backing = true;
  // cuDriverGetVersion's answer; cuGetProcAddress refuses variants newer than it.
  int driver_version = 13000;
  bool peer_access = true;  // cuDeviceCanAccessPeer between distinct devices
  bool posix_fd = true;     // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
  bool rdma = true;         // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
  // sim_rdma:wsl (implies rdma): WSL2's driver, which says attribute 110 is 1 and lets
  // cuMemCreate/cuMemMap take gpuDirectRDMACapable, then fails cuMemSetAccess on such memory
  // with CUDA_ERROR_UNKNOWN (pytorch/pytorch#192330).
  bool rdma_wsl = false;
  // Pinned host memory (cuMemHostAlloc) the sim hands out in all, over every context; beyond it
  // cuMemHostAlloc answers CUDA_ERROR_OUT_OF_MEMORY (a host that cannot lock more pages).
  size_t host_capacity = size_t{1} << 40;
  // Host memory through the VMM API (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA; attribute
  // 141): its pages count against host_capacity with cuMemHostAlloc's, apart from any device's.
  bool host_numa = true;
  int numa_nodes = 1;  // host NUMA nodes 0..numa_nodes-1 (attribute 134 answers node 0)
  // How far the GPU runs behind the host, in ticks of the host clock (sim::advance_host_clock):
  // work put on a stream (an event record, a copy) completes only once the clock has advanced
  // this far past the moment it was issued, as on a GPU busy with the application's earlier
  // kernels. 0: work completes when issued (unless its stream is held). Synchronizing waits for
  // the work, so it completes it at once either way.
  uint64_t gpu_lag = 0;
};

// Parses the sim_* keys of an EXPANSE_CONF string (other known keys are accepted and ignored;
// unknown keys and bad values throw std::invalid_argument naming them).
SimOptions parse_sim_options(const std::string& conf);

}  // namespace expanse::conf
