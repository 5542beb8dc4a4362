// The replay's host model (replay/host_model.hpp): its text form (the CLI's --host), its
// defaults, and which operations of a trace it gives to the autograd thread.
#include "replay/host_model.hpp"
#include "replay/replay.hpp"

#include "expanse/errors.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace expanse::test {
namespace {

using replay::HostModel;
using replay::parse_host_model;

constexpr uint64_t MiB = uint64_t{1} << 20;

void expect_same(const HostModel& a, const HostModel& b) {
  EXPECT_EQ(a.gpu_lag, b.gpu_lag);
  EXPECT_EQ(a.autograd_thread, b.autograd_thread);
  EXPECT_EQ(a.thread_caches, b.thread_caches);
  EXPECT_EQ(a.null_stream, b.null_stream);
}

// Replays default to PyTorch's path on a GPU running behind; "plain" is one thread, no thread
// caches, no lag.
TEST(HostModel, Defaults) {
  const HostModel torch = replay::default_host_model();
  EXPECT_GT(torch.gpu_lag, 0u);
  EXPECT_TRUE(torch.autograd_thread);
  EXPECT_TRUE(torch.thread_caches);
  EXPECT_TRUE(torch.null_stream);
  expect_same(replay::ReplayOptions{}.host, torch);

  const HostModel plain = replay::plain_host_model();
  EXPECT_EQ(plain.gpu_lag, 0u);
  EXPECT_FALSE(plain.autograd_thread);
  EXPECT_FALSE(plain.thread_caches);
  EXPECT_TRUE(plain.null_stream);
}

TEST(HostModel, ParsesNamesAndKeys) {
  expect_same(parse_host_model("torch", replay::plain_host_model()), replay::default_host_model());
  expect_same(parse_host_model("plain"), replay::plain_host_model());

  const HostModel m = parse_host_model("gpu_lag=7,threads=1,thread_caches=off,stream=legacy");
  EXPECT_EQ(m.gpu_lag, 7u);
  EXPECT_FALSE(m.autograd_thread);
  EXPECT_FALSE(m.thread_caches);
  EXPECT_FALSE(m.null_stream);

  const HostModel n = parse_host_model("threads=2,thread_caches=on,stream=null,gpu_lag=0",
                                       replay::plain_host_model());
  EXPECT_EQ(n.gpu_lag, 0u);
  EXPECT_TRUE(n.autograd_thread);
  EXPECT_TRUE(n.thread_caches);
  EXPECT_TRUE(n.null_stream);

  // Keys left out keep the base's values; a name sets all of them, later keys win over it.
  const HostModel lag_only = parse_host_model("gpu_lag=12");
  EXPECT_EQ(lag_only.gpu_lag, 12u);
  EXPECT_TRUE(lag_only.autograd_thread);
  EXPECT_TRUE(lag_only.thread_caches);
  const HostModel plain_lagging = parse_host_model("plain,gpu_lag=3");
  EXPECT_EQ(plain_lagging.gpu_lag, 3u);
  EXPECT_FALSE(plain_lagging.autograd_thread);
  expect_same(parse_host_model(""), replay::default_host_model());

  // describe() reads back as the same model.
  for (const HostModel& h : {replay::default_host_model(), replay::plain_host_model(), m, n}) {
    SCOPED_TRACE(h.describe());
    expect_same(parse_host_model(h.describe(), replay::plain_host_model()), h);
  }
}

// A bad key or value is an error that names it, never ignored.
TEST(HostModel, BadKeysAndValuesAreNamed) {
  const struct {
    const char* text;
    const char* key;
    const char* value;
  } bad[] = {
      {"threads=3", "threads", "3"},
      {"thread_caches=maybe", "thread_caches", "maybe"},
      {"stream=per_thread", "stream", "per_thread"},
      {"gpu_lag=-1", "gpu_lag", "-1"},
      {"gpu_lag=soon", "gpu_lag", "soon"},
      {"torch,colour=red", "colour", ""},
      {"sometimes", "sometimes", ""},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.text);
    try {
      parse_host_model(b.text);
      ADD_FAILURE() << "accepted";
    } catch (const usage_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(b.key), std::string::npos) << msg;
      EXPECT_NE(msg.find(b.value), std::string::npos) << msg;
    }
  }
}

// Builds a trace operation by operation; live bytes are tracked to set peak_live_bytes.
class TraceMaker {
 public:
  uint32_t alloc(uint64_t size) {
    const uint32_t b = t_.blocks++;
    t_.ops.push_back({trace::TraceOp::Type::alloc, 0, b, size});
    sizes_.push_back(size);
    live_ += size;
    t_.peak_live_bytes = std::max(t_.peak_live_bytes, live_);
    return b;
  }
  void free(uint32_t b) {
    t_.ops.push_back({trace::TraceOp::Type::free, 0, b, 0});
    live_ -= sizes_[b];
  }
  size_t next_op() const { return t_.ops.size(); }
  trace::Trace take() {
    t_.streams = {0};
    return t_;
  }

 private:
  trace::Trace t_;
  std::vector<uint64_t> sizes_;
  uint64_t live_ = 0;
};

// Training steps: the forward pass saves activations (with temporaries), the backward pass
// frees them in reverse with gradient temporaries, the optimizer works at the trough. The
// backward is the autograd thread's, the rest the main thread's.
TEST(HostModel, TheBackwardOfATrainingStepIsTheAutogradThreads) {
  TraceMaker m;
  m.alloc(60 * MiB);  // the weights, live to the end
  struct Range {
    size_t begin, end;
  };
  std::vector<Range> forward, backward, optimizer;
  for (int step = 0; step < 3; ++step) {
    const int saved_count = 30 + 5 * step;  // steps differ in shape
    std::vector<uint32_t> saved;
    forward.push_back({m.next_op(), 0});
    for (int i = 0; i < saved_count; ++i) {
      m.free(m.alloc(2 * MiB));  // a temporary of the layer
      saved.push_back(m.alloc(8 * MiB + static_cast<uint64_t>(i) * 4096));
    }
    forward.back().end = m.next_op();
    backward.push_back({m.next_op(), 0});
    while (!saved.empty()) {
      m.free(saved.back());
      saved.pop_back();
      m.free(m.alloc(1 * MiB));  // the gradient's temporary
    }
    backward.back().end = m.next_op();
    optimizer.push_back({m.next_op(), 0});
    for (int i = 0; i < 6; ++i) m.free(m.alloc(512 * 1024));
    optimizer.back().end = m.next_op();
  }
  const trace::Trace t = m.take();
  const std::vector<uint8_t> thread = replay::autograd_threads(t);
  ASSERT_EQ(thread.size(), t.ops.size());
  for (size_t s = 0; s < forward.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s + 1));
    for (size_t i = forward[s].begin; i < forward[s].end; ++i) {
      EXPECT_EQ(thread[i], 0) << "forward op " << i << " on the autograd thread";
    }
    for (size_t i = optimizer[s].begin; i < optimizer[s].end; ++i) {
      EXPECT_EQ(thread[i], 0) << "optimizer op " << i << " on the autograd thread";
    }
    EXPECT_EQ(thread[backward[s].begin], 1) << "the backward's first free on the main thread";
    size_t on_autograd = 0;
    for (size_t i = backward[s].begin; i < backward[s].end; ++i) on_autograd += thread[i];
    const size_t n = backward[s].end - backward[s].begin;
    // The tail within 1/16 of the fall of the trough is the main thread's (documented).
    EXPECT_GE(on_autograd * 16, n * 14) << on_autograd << " of " << n << " backward ops";
  }
}

// Inference (weights, then requests whose temporaries come and go, a small fraction of what
// is live) and a trace with no swing at all stay on the main thread.
TEST(HostModel, FlatAndInferenceTracesStayOnTheMainThread) {
  {
    TraceMaker m;
    m.alloc(1024 * MiB);
    for (int request = 0; request < 200; ++request) {
      std::vector<uint32_t> tmp;
      for (int k = 0; k < 8; ++k) tmp.push_back(m.alloc((1 + (request + k) % 6) * MiB));
      for (uint32_t b : tmp) m.free(b);
    }
    const trace::Trace t = m.take();
    const std::vector<uint8_t> thread = replay::autograd_threads(t);
    ASSERT_EQ(thread.size(), t.ops.size());
    for (size_t i = 0; i < thread.size(); ++i) ASSERT_EQ(thread[i], 0) << "op " << i;
  }
  {
    TraceMaker m;
    for (int i = 0; i < 100; ++i) m.alloc(4 * MiB);
    const trace::Trace t = m.take();
    for (uint8_t th : replay::autograd_threads(t)) ASSERT_EQ(th, 0);
  }
  EXPECT_TRUE(replay::autograd_threads(trace::Trace{}).empty());
}

}  // namespace
}  // namespace expanse::test
