// One allocator as the peers benchmark drives it: allocate and free on a stream, release its
// cache, and its own figure of peak reserved memory. Each kind is built only when its library
// was found at configure time (bench/peers/CMakeLists.txt); peer_kinds() lists every kind, with
// the reason where one was left out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct CUstream_st;

namespace expanse::peers {

using Stream = CUstream_st*;  // cudaStream_t / CUstream

class Peer {
 public:
  virtual ~Peer() = default;
  // nullptr when the allocator is out of memory; any other failure throws.
  virtual void* allocate(size_t bytes, Stream s) = 0;
  // bytes and s: as allocated (RMM needs both; the others ignore what they do not need).
  virtual void deallocate(void* p, size_t bytes, Stream s) = 0;
  // torch.cuda.empty_cache()'s equivalent: cached memory back to the driver.
  virtual void release_cached() = 0;
  virtual void reset_peak() = 0;
  // The allocator's own figure of the most device memory it held since reset_peak().
  virtual uint64_t peak_reserved() = 0;
  // Where that figure comes from, for the table's footnote.
  virtual const char* peak_source() const = 0;
};

struct PeerKind {
  std::string name;
  std::string left_out;  // empty: built in; otherwise why it is not
  bool needs_gpu = true; // false: runs on expanse's sim as well
  // Environment the child process running this kind starts with (read by the allocator once,
  // when its library loads or at first use).
  std::vector<std::pair<std::string, std::string>> env;
  std::function<std::unique_ptr<Peer>()> make;
};

// Every kind, in table order. expanse_conf: the EXPANSE_CONF of the expanse columns (thread
// caches on by default; the second column adds thread_cache:0).
std::vector<PeerKind> peer_kinds(const std::string& expanse_conf);

// One factory per allocator family (each in its own file).
std::unique_ptr<Peer> make_expanse_peer();
std::unique_ptr<Peer> make_cuda_async_peer();
std::unique_ptr<Peer> make_torch_peer();
std::unique_ptr<Peer> make_rmm_pool_peer();
std::unique_ptr<Peer> make_rmm_arena_peer();

}  // namespace expanse::peers
