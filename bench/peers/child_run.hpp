// The program runs each allocator in a child process of its own: a fresh CUDA context (no
// memory still cached by the previous allocator) and an environment set before any library
// loads (PyTorch reads PYTORCH_CUDA_ALLOC_CONF once). The child writes result lines to its
// stdout, a pipe the parent reads; its stderr is the parent's.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace expanse::peers {

struct ChildOutput {
  std::vector<std::string> lines;
  int exit_code = -1;      // -1: killed by a signal
  std::string how_ended;   // "exit code 1", "signal 11", ... (empty when it exited 0)
};

// Runs this program again (/proc/self/exe) with `args`, `env` added to the environment.
ChildOutput run_child(const std::vector<std::string>& args,
                      const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace expanse::peers
