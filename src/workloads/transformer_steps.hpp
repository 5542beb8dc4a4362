// A synthetic training run whose steps vary in shape: a GPT-2-like Transformer language model
// trained with AdamW on a random batch of random-length sequences each step, as PyTorch runs it
// (forward, loss and optimizer on the main thread; backward on the autograd engine's thread).
// The allocations follow the model's tensors: weights, then per step the activations each layer
// saves for backward and its temporaries, the logits and the loss, then in backward the
// gradients, with the saved activations freed layer by layer in reverse, then AdamW's state (kept)
// and temporaries, and zero_grad() freeing the gradients. Sizes are the tensors' bytes (fp32),
// rounded to 512 B as PyTorch's allocator records them.
#pragma once

#include "trace/trace.hpp"

#include <cstdint>
#include <vector>

namespace expanse::replay {

struct TransformerSteps {
  int layers = 12;
  uint64_t width = 768;
  uint64_t heads = 12;
  uint64_t vocab = 50257;
  uint64_t positions = 1024;
  // Each step draws a batch in [min_batch, max_batch] and a length in [min_length, max_length],
  // uniformly.
  uint64_t min_batch = 2, max_batch = 12;
  uint64_t min_length = 64, max_length = 1024;
  int steps = 30;
  uint64_t seed = 1;
};

struct TransformerRun {
  trace::Trace trace;                  // threads: 0 main, 1 autograd
  std::vector<uint64_t> step_ends;     // the last operation of each step (index into ops)
  std::vector<uint64_t> batch, length;  // each step's shape
};

// The workload as a trace (format "transformer-steps"), one stream (the legacy default stream).
TransformerRun transformer_steps(const TransformerSteps& s);

}  // namespace expanse::replay
