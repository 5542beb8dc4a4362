// The table's columns and what each child process needs. Which libraries were found is decided
// at configure time: EXPANSE_PEER_TORCH / EXPANSE_PEER_RMM are defined when they were, and
// EXPANSE_PEER_TORCH_MISSING / EXPANSE_PEER_RMM_MISSING say why not otherwise.
#include "peers/peer.hpp"

namespace expanse::peers {

std::vector<PeerKind> peer_kinds(const std::string& expanse_conf) {
  std::vector<PeerKind> k;
  k.push_back({"expanse", "", false, {{"EXPANSE_CONF", expanse_conf}}, make_expanse_peer});
  k.push_back({"expanse thread_cache:0", "", false,
               {{"EXPANSE_CONF", expanse_conf + ",thread_cache:0"}}, make_expanse_peer});
  k.push_back({"cudaMallocAsync", "", true, {}, make_cuda_async_peer});
#ifdef EXPANSE_PEER_TORCH
  // Both variables: PyTorch reads PYTORCH_ALLOC_CONF too, and which one wins has changed.
  k.push_back({"torch native", "", true,
               {{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"},
                {"PYTORCH_ALLOC_CONF", "expandable_segments:False"}},
               make_torch_peer});
  k.push_back({"torch expandable", "", true,
               {{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"},
                {"PYTORCH_ALLOC_CONF", "expandable_segments:True"}},
               make_torch_peer});
#else
  k.push_back({"torch native", EXPANSE_PEER_TORCH_MISSING, true, {}, nullptr});
  k.push_back({"torch expandable", EXPANSE_PEER_TORCH_MISSING, true, {}, nullptr});
#endif
#ifdef EXPANSE_PEER_RMM
  k.push_back({"rmm pool", "", true, {}, make_rmm_pool_peer});
  k.push_back({"rmm arena", "", true, {}, make_rmm_arena_peer});
#else
  k.push_back({"rmm pool", EXPANSE_PEER_RMM_MISSING, true, {}, nullptr});
  k.push_back({"rmm arena", EXPANSE_PEER_RMM_MISSING, true, {}, nullptr});
#endif
  return k;
}

}  // namespace expanse::peers
