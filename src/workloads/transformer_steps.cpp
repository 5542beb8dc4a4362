#include "workloads/transformer_steps.hpp"

#include <algorithm>
#include <random>
#include <utility>

namespace expanse::replay {
namespace {

constexpr uint64_t kFloat = 4;  // fp32

uint64_t rounded(uint64_t bytes) { return (std::max<uint64_t>(bytes, 1) + 511) / 512 * 512; }

// Writes the trace one operation at a time, keeping its figures.
class Builder {
 public:
  explicit Builder(trace::Trace& t) : t_(t) {}

  uint32_t alloc(uint64_t bytes, uint8_t thread) {
    trace::TraceOp op;
    op.type = trace::TraceOp::Type::alloc;
    op.block = t_.blocks++;
    op.size = rounded(bytes);
    push(op, thread);
    size_.push_back(op.size);
    live_ += op.size;
    t_.peak_live_bytes = std::max(t_.peak_live_bytes, live_);
    ++t_.allocs;
    return op.block;
  }
  void free(uint32_t block, uint8_t thread) {
    trace::TraceOp op;
    op.type = trace::TraceOp::Type::free;
    op.block = block;
    push(op, thread);
    live_ -= size_[block];
    ++t_.frees;
  }
  uint64_t last_op() const { return t_.ops.size() - 1; }
  uint64_t size_of(uint32_t block) const { return size_[block]; }
  void finish() {
    t_.events = t_.ops.size();
    t_.live_at_end_bytes = live_;
  }

 private:
  void push(const trace::TraceOp& op, uint8_t thread) {
    t_.ops.push_back(op);
    t_.threads.push_back(thread);
  }
  trace::Trace& t_;
  std::vector<uint64_t> size_;
  uint64_t live_ = 0;
};

constexpr uint8_t kMain = 0;
constexpr uint8_t kAutograd = 1;

}  // namespace

TransformerRun transformer_steps(const TransformerSteps& s) {
  TransformerRun run;
  trace::Trace& t = run.trace;
  t.path = "transformer-steps";
  t.format = "transformer-steps";
  t.devices_with_events = 1;
  t.streams = {0};
  Builder b(t);
  std::mt19937_64 rng(s.seed);
  const uint64_t d = s.width;

  // Weights: token and position embeddings, per layer two layer norms, the attention's qkv and
  // output projections, the MLP's two projections (with biases), the final layer norm; the
  // language-model head shares the token embedding.
  std::vector<uint64_t> params = {s.vocab * d, s.positions * d};
  for (int l = 0; l < s.layers; ++l) {
    for (uint64_t n : {2 * d, d * 3 * d, 3 * d, d * d, d, 2 * d, d * 4 * d, 4 * d, 4 * d * d, d}) {
      params.push_back(n);
    }
  }
  params.push_back(2 * d);
  for (uint64_t n : params) b.alloc(n * kFloat, kMain);
  std::vector<uint32_t> adam_state;  // exp_avg and exp_avg_sq, made at the first step

  for (int step = 0; step < s.steps; ++step) {
    const uint64_t batch = std::uniform_int_distribution<uint64_t>(s.min_batch, s.max_batch)(rng);
    const uint64_t len = std::uniform_int_distribution<uint64_t>(s.min_length, s.max_length)(rng);
    run.batch.push_back(batch);
    run.length.push_back(len);
    const uint64_t T = batch * len;  // tokens
    const uint64_t act = T * d * kFloat;

    // ---- forward (main thread): what each layer saves for backward, in order ----
    const uint32_t ids = b.alloc(T * 8, kMain);
    const uint32_t labels = b.alloc(T * 8, kMain);
    std::vector<uint32_t> saved;
    auto keep = [&](uint64_t bytes) { saved.push_back(b.alloc(bytes, kMain)); };
    auto temp = [&](uint64_t bytes) { return b.alloc(bytes, kMain); };
    const uint32_t tok = temp(act), pos = temp(len * d * kFloat);
    keep(act);  // embedding sum (the residual stream)
    b.free(tok, kMain);
    b.free(pos, kMain);
    keep(T * d);  // dropout mask (bytes)
    // A layer norm saves its output and its mean and rstd.
    auto layer_norm = [&] {
      keep(act);
      keep(T * 2 * kFloat);
    };
    // A projection back to the residual stream: its output (a temporary), dropout's mask (saved)
    // and output (a temporary), and the residual sum (saved).
    auto dropout_residual = [&] {
      const uint32_t proj = temp(act);
      keep(T * d);  // dropout mask
      const uint32_t dropped = temp(act);
      b.free(proj, kMain);
      keep(act);  // residual
      b.free(dropped, kMain);
    };
    for (int l = 0; l < s.layers; ++l) {
      layer_norm();                          // ln_1
      keep(3 * act);                         // qkv
      keep(act);                             // attention output (heads merged)
      keep(batch * s.heads * len * kFloat);  // logsumexp
      dropout_residual();                    // attention projection
      layer_norm();                          // ln_2
      keep(4 * act);                         // c_fc output
      const uint32_t g1 = temp(4 * act), g2 = temp(4 * act);  // tanh-GELU's temporaries
      b.free(g1, kMain);
      keep(4 * act);  // tanh
      b.free(g2, kMain);
      keep(4 * act);  // GELU output
      dropout_residual();  // MLP projection
    }
    layer_norm();  // ln_f
    const uint32_t logits = temp(T * s.vocab * kFloat);   // returned to the caller
    const uint64_t shifted = batch * (len - 1) * s.vocab * kFloat;
    const uint32_t shift = temp(shifted);                 // logits[..., :-1, :].contiguous()
    keep(shifted);                                        // log_softmax output
    b.free(shift, kMain);
    const uint32_t loss = temp(kFloat);

    // ---- backward (autograd thread): gradients in reverse, saved tensors freed ----
    std::vector<uint32_t> grads;  // parameter gradients (zero_grad frees them)
    uint32_t upstream = b.alloc(shifted, kAutograd);  // d loss / d log_softmax
    const uint32_t dlogits = b.alloc(T * s.vocab * kFloat, kAutograd);
    b.free(upstream, kAutograd);
    upstream = dlogits;
    size_t next_param = params.size();
    for (size_t i = saved.size(); i-- > 0;) {
      // The gradient of each saved activation (masks and statistics have none) replaces the
      // one flowing down.
      if (b.size_of(saved[i]) >= act) {
        const uint32_t g = b.alloc(b.size_of(saved[i]), kAutograd);
        b.free(upstream, kAutograd);
        upstream = g;
      }
      b.free(saved[i], kAutograd);
      // Every few saved tensors, a layer's weight gradients (in reverse).
      if (i % 3 == 0 && next_param > 0) grads.push_back(b.alloc(params[--next_param] * kFloat, kAutograd));
    }
    while (next_param > 0) grads.push_back(b.alloc(params[--next_param] * kFloat, kAutograd));
    b.free(upstream, kAutograd);

    // ---- optimizer and zero_grad (main thread) ----
    if (adam_state.empty()) {
      for (uint64_t n : params) {
        adam_state.push_back(b.alloc(n * kFloat, kMain));
        adam_state.push_back(b.alloc(n * kFloat, kMain));
      }
    }
    for (int pass = 0; pass < 2; ++pass) {  // foreach temporaries, one per parameter
      std::vector<uint32_t> tmp;
      for (uint64_t n : params) tmp.push_back(b.alloc(n * kFloat, kMain));
      for (uint32_t x : tmp) b.free(x, kMain);
    }
    for (uint32_t g : grads) b.free(g, kMain);
    b.free(loss, kMain);
    b.free(logits, kMain);
    b.free(ids, kMain);
    b.free(labels, kMain);
    run.step_ends.push_back(b.last_op());
  }
  b.finish();
  return run;
}

}  // namespace expanse::replay
