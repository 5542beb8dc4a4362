// expanse through its public C++ API, configured by the child's EXPANSE_CONF.
#include "expanse/expanse.hpp"
#include "peers/peer.hpp"

namespace expanse::peers {
namespace {

class ExpansePeer final : public Peer {
 public:
  void* allocate(size_t bytes, Stream s) override {
    try {
      return expanse::allocate(bytes, 0, s);
    } catch (const expanse::out_of_memory&) {
      return nullptr;
    }
  }
  void deallocate(void* p, size_t, Stream s) override { expanse::deallocate(p, 0, s); }
  void release_cached() override { dev_.release_cached(); }
  void reset_peak() override { dev_.reset_peak_stats(); }
  uint64_t peak_reserved() override { return dev_.stats().peak_physical_bytes; }
  const char* peak_source() const override { return "stats().peak_physical_bytes"; }

 private:
  expanse::device_allocator dev_{0};
};

}  // namespace

std::unique_ptr<Peer> make_expanse_peer() { return std::make_unique<ExpansePeer>(); }

}  // namespace expanse::peers
