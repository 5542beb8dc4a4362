// StreamOrder on its own (stream_order.hpp): stream states keyed by the driver's identity, a
// freed block owned by its stream until a fence proves its work done, blocks pending on the
// other streams that used them, and the event pool.
#include "core/streams/event_pool.hpp"
#include "parts_fixture.hpp"

namespace expanse::test {
namespace {

using core::BlockState;
using core::StreamOrder;

class StreamOrderUnitTest : public CorePartsTest {
 protected:
  StreamOrder::StreamState& state(CUstream s) {
    return streams_->state(s, streams_->identify(s, "test", nullptr));
  }
  // A live block of `bytes` allocated on ss.
  core::BlockIt live_block(StreamOrder::StreamState& ss, size_t offset, size_t bytes) {
    if (placement_->index().blocks().empty()) placement_->add_reservation(core::Arena::large, P);
    core::BlockIt it = carve(placement_->res(0), offset, bytes);
    streams_->on_alloc(it->second, ss);
    return it;
  }
};

TEST_F(StreamOrderUnitTest, AStreamIsKeyedByTheDriversIdentityNotItsHandle) {
  CUstream s = new_stream();
  StreamOrder::Call call(*streams_);
  StreamOrder::StreamState& a = state(s);
  StreamOrder::StreamState& again = state(s);
  EXPECT_EQ(&a, &again);
  EXPECT_EQ(a.kind, core::StreamIdentity::created);
  EXPECT_EQ(a.ctx, dd_->primary());
  StreamOrder::StreamState& legacy = state(nullptr);
  EXPECT_NE(legacy.key, a.key);
  EXPECT_EQ(legacy.kind, core::StreamIdentity::legacy);
  EXPECT_EQ(legacy.handle, CU_STREAM_LEGACY) << "fences on a legacy key go on the legacy stream";
  EXPECT_EQ(streams_->tracked_streams(), 2u);
}

TEST_F(StreamOrderUnitTest, AFreedBlockIsItsStreamsUntilAFenceProvesTheWorkDone) {
  CUstream s = new_stream();
  StreamOrder::Call call(*streams_);
  StreamOrder::StreamState& ss = state(s);
  core::BlockIt it = live_block(ss, 0, 4 * P);
  EXPECT_EQ(it->second.stream, ss.key);
  EXPECT_EQ(ss.live_refs, 1u);
  StreamOrder::Deps deps =
      streams_->end_uses(it->second, ss, streams_->make_room_for_free(it->second, ss));
  EXPECT_TRUE(deps.empty()) << "nobody else used it";
  EXPECT_EQ(ss.live_refs, 0u);
  const CUdeviceptr addr = it->first;
  streams_->on_free(it, ss, std::move(deps));
  const core::Block& b = placement_->index().blocks().at(addr);
  EXPECT_EQ(b.state, BlockState::free);
  EXPECT_FALSE(b.safe);
  EXPECT_EQ(b.stream, ss.key);
  EXPECT_TRUE(streams_->has_unfinished_frees());
  ASSERT_EQ(ss.recent.size(), 1u) << "a place to put the next block of its size";
  EXPECT_EQ(ss.recent[0].addr, addr);
  sim::hold_stream(s);
  streams_->poll(false);
  EXPECT_TRUE(streams_->has_unfinished_frees()) << "the stream's work has not completed";
  sim::release_stream(s);
  streams_->poll(false);
  EXPECT_FALSE(streams_->has_unfinished_frees());
  EXPECT_TRUE(placement_->index().blocks().at(placement_->res(0).base).safe);
}

TEST_F(StreamOrderUnitTest, ABlockAnotherStreamUsedIsPendingUntilThatStreamPassesTheFree) {
  CUstream s1 = new_stream(), s2 = new_stream();
  core::BlockIt it;
  {
    StreamOrder::Call call(*streams_);
    it = live_block(state(s1), 0, 2 * P);
  }
  {
    StreamOrder::Call call(*streams_);
    StreamOrder::StreamState& user = state(s2);
    streams_->add_user(it->second, user);
    EXPECT_EQ(user.live_refs, 1u);
  }
  sim::hold_stream(s2);
  StreamOrder::Call call(*streams_);
  StreamOrder::StreamState& ss = state(s1);
  StreamOrder::Deps deps =
      streams_->end_uses(it->second, ss, streams_->make_room_for_free(it->second, ss));
  ASSERT_EQ(deps.size(), 1u) << "s2 used it";
  streams_->on_free(it, ss, std::move(deps));
  EXPECT_EQ(it->second.state, BlockState::pending);
  EXPECT_TRUE(streams_->has_unfinished_frees());
  streams_->poll(false);
  EXPECT_EQ(it->second.state, BlockState::pending) << "s2's work is held";
  sim::release_stream(s2);
  streams_->poll(true);  // s2 is not this call's stream: its context is synchronized
  EXPECT_FALSE(streams_->has_unfinished_frees());
  EXPECT_EQ(placement_->index().free_blocks(), 1u);
}

// A thread's exit gives its cache's blocks back from a thread_local destructor, when the driver
// may have torn the thread's per-thread stream down already (a record there would land on a
// fresh, empty stream and prove nothing): a free owing a fence records none on that stream then;
// the block waits for a context synchronize. Outside an exit, the same free records one.
TEST_F(StreamOrderUnitTest, AnExitingThreadRecordsNoFenceOnItsPerThreadStream) {
  StreamOrder::Call call(*streams_);
  StreamOrder::StreamState& ss = state(CU_STREAM_PER_THREAD);
  ASSERT_EQ(ss.kind, core::StreamIdentity::per_thread);
  auto free_owing_a_fence = [&](size_t offset) {
    core::BlockIt it = live_block(ss, offset, P);
    it->second.freed_by = ss.key + 1;  // placed in memory another stream freed: it wants it back
    StreamOrder::Deps deps =
        streams_->end_uses(it->second, ss, streams_->make_room_for_free(it->second, ss));
    const uint64_t records = sim::call_count(driver::EntryPoint::event_record);
    streams_->on_free(it, ss, std::move(deps));
    return sim::call_count(driver::EntryPoint::event_record) - records;
  };
  {
    StreamOrder::ThreadExit exiting(*streams_);
    EXPECT_EQ(free_owing_a_fence(0), 0u) << "a fence on the exiting thread's per-thread stream";
  }
  EXPECT_EQ(free_owing_a_fence(4 * P), 1u) << "the free owed a fence and the thread lives";
}

TEST_F(StreamOrderUnitTest, EventPoolReusesEventsPerContext) {
  core::EventPool pool(*dd_);
  CUcontext ctx = dd_->primary();
  CUevent e = pool.get(ctx);
  ASSERT_NE(e, nullptr);
  pool.put(ctx, e);
  EXPECT_EQ(pool.get(ctx), e) << "a put event comes back";
  CUevent f = pool.get(ctx);
  EXPECT_NE(f, e);
  EXPECT_EQ(pool.made(), 2u);
  pool.destroy_all();
  EXPECT_EQ(pool.made(), 0u);
}

}  // namespace
}  // namespace expanse::test
