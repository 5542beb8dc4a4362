// Where a fuzzer's choices come from: a seeded generator (the unit tests, in every build) or the
// bytes libFuzzer hands a target (test/fuzz). The harnesses (c_abi_fuzz.hpp, ipc_record_fuzz.hpp)
// ask only for pick(n), so one harness serves both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace expanse::test::fuzz {

// Where choices come from. pick(n) is in [0, n); done() once no more choices are left.
class Choices {
 public:
  virtual ~Choices() = default;
  virtual uint64_t pick(uint64_t n) = 0;
  virtual bool done() const = 0;
};

class SeededChoices final : public Choices {
 public:
  SeededChoices(uint64_t seed, size_t ops) : rng_(seed), left_(ops) {}
  uint64_t pick(uint64_t n) override {
    if (left_ > 0) --left_;
    return n == 0 ? 0 : rng_() % n;
  }
  bool done() const override { return left_ == 0; }

 private:
  std::mt19937_64 rng_;
  size_t left_;  // picks left (an operation takes a few)
};

class ByteChoices final : public Choices {
 public:
  ByteChoices(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint64_t pick(uint64_t n) override {
    uint64_t v = 0;
    for (int i = 0; i < 2 && p_ < end_; ++i) v = (v << 8) | *p_++;
    return n == 0 ? 0 : v % n;
  }
  bool done() const override { return p_ >= end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace expanse::test::fuzz
