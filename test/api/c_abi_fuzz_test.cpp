// The C ABI fuzzed (c_abi_fuzz.hpp) with seeded choices: one thread with the device-wide books
// checked after every call, and four threads at once (each its own blocks and pools; one of them
// injecting driver failures), as CI runs it under ASan and TSan. EXPANSE_FUZZ_OPS and
// EXPANSE_FUZZ_SEEDS set one thread's operations and seeds (default 3000 and 3),
// EXPANSE_FUZZ_THREAD_OPS and EXPANSE_FUZZ_THREAD_SEEDS each of four threads' (1000 and 2).
#include "c_abi_fuzz.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

namespace expanse::test::fuzz {
namespace {

size_t env_or(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

std::string report(const CAbiFuzzer& f) {
  std::string out;
  for (const std::string& m : f.failures()) out += m + "\n";
  return out;
}

class CAbiFuzzThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(expanse_init(fuzz_conf()), EXPANSE_OK) << expanse_last_error(); }
  void TearDown() override {
    sim::clear_injections();
    EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  }
};

TEST_F(CAbiFuzzThreadsTest, OneThreadKeepsTheBooksUnderMisuseAndFaults) {
  const size_t ops = env_or("EXPANSE_FUZZ_OPS", 3000);
  for (uint64_t seed = 1; seed <= env_or("EXPANSE_FUZZ_SEEDS", 3); ++seed) {
    for (bool faults : {false, true}) {
      CAbiFuzzer f(0, true, faults);
      SeededChoices c(seed, ops * 8);
      f.run(c, ops);
      f.finish();
      EXPECT_TRUE(f.failures().empty())
          << "seed " << seed << (faults ? " with faults" : "") << ":\n" << report(f);
      EXPECT_GE(f.operations(), ops / 2);
    }
  }
}

// Found by the fuzzer: after its unmap, a registrable block is freed whatever the driver says
// about its release (before, the free answered an error with the block already gone, so the
// caller believed it live); the handle the driver kept is pooled and released at the next trim.
TEST_F(CAbiFuzzThreadsTest, ARegistrableBlockWhoseReleaseFailsIsStillFreed) {
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 3 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  sim::inject_failure(driver::EntryPoint::mem_release, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(expanse_free_checked(p, 3 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  sim::clear_injections();
  expanse_pool_id of = 7;
  EXPECT_EQ(expanse_pool_of(p, &of), EXPANSE_EINVAL) << "no longer live";
  EXPECT_EQ(expanse_free_checked(p, 3 << 20, 0, nullptr), EXPANSE_EINVAL) << "freed once";
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_EQ(s.requested_bytes, 0u);
  EXPECT_EQ(s.physical_bytes, size_t{4} << 20) << "its handle, pooled";
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_EQ(s.physical_bytes, 0u) << "released at the trim";
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by the fuzzer: an import the driver refuses for lack of memory says so (ENOMEM), not
// that the fd is not one expanse exported.
TEST_F(CAbiFuzzThreadsTest, AnImportRefusedForMemoryIsOutOfMemory) {
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  sim::inject_failure(driver::EntryPoint::mem_import_from_shareable_handle, 1,
                      CUDA_ERROR_OUT_OF_MEMORY);
  void* q = nullptr;
  EXPECT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_ENOMEM) << expanse_last_error();
  EXPECT_NE(std::string(expanse_last_error()).find("out of memory"), std::string::npos)
      << expanse_last_error();
  EXPECT_EQ(q, nullptr);
  sim::clear_injections();
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK);
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by the fuzzer on four threads: an import the driver refused for memory was undone twice,
// the second time freeing an address range (and unmapping what lay there) that another thread's
// import could already hold. One undo: one cuMemAddressFree for the one cuMemAddressReserve.
TEST_F(CAbiFuzzThreadsTest, AFailedImportIsUndoneOnce) {
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  for (CUresult code : {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN}) {
    sim::inject_failure(driver::EntryPoint::mem_import_from_shareable_handle, 1, code);
    sim::reset_counts();
    void* q = nullptr;
    EXPECT_NE(expanse_ipc_import(&h, 0, &q), EXPANSE_OK);
    EXPECT_EQ(sim::call_count(driver::EntryPoint::mem_address_reserve), 1u);
    EXPECT_EQ(sim::call_count(driver::EntryPoint::mem_address_free), 1u)
        << "undone once after " << code;
    sim::clear_injections();
  }
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by the fuzzer on four threads: a close whose handle release failed after the unmap
// answered an error with the import already unmapped and gone from the books, so the caller
// read an address that was no longer mapped. Now the close succeeds and the handle is given back
// at the next close.
TEST_F(CAbiFuzzThreadsTest, AnImportWhoseReleaseFailsIsStillClosed) {
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  sim::inject_failure(driver::EntryPoint::mem_release, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  sim::clear_injections();
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_EINVAL) << "closed once";
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  sim::reset_counts();
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(sim::call_count(driver::EntryPoint::mem_release), 2u)
      << "its own handle and the one the failed release kept";
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by the fuzzer: an exported registrable block freed while the reservation had no room
// for a replacement released its handle (no block may reuse it: an importer maps it still), and
// the memory held dipped below the reservation. Now the handle is retired, counted as stranded,
// and released once a replacement exists.
TEST_F(CAbiFuzzThreadsTest, AnExportedBlockFreedUnderAFullReservationDoesNotDipIt) {
  size_t got = 0;
  ASSERT_EQ(expanse_reserve(0, kFuzzCapacity, &got), EXPANSE_OK) << expanse_last_error();
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_GE(s.physical_low_water_bytes, s.reserved_bytes);
  EXPECT_EQ(s.reserve_stranded_bytes, size_t{2} << 20) << "its handle, retired";
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  // With room again, a replacement is made first and the retired handle goes.
  ASSERT_EQ(expanse_unreserve(0), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_reserve(0, kFuzzCapacity / 2, &got), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_release_cached(0), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_EQ(s.reserve_stranded_bytes, 0u);
  EXPECT_EQ(s.physical_bytes, s.reserved_bytes);
  EXPECT_GE(s.physical_low_water_bytes, s.reserved_bytes);
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
  EXPECT_EQ(expanse_unreserve(0), EXPANSE_OK);
}

// Found by the fuzzer: a free of a registrable block whose cuCtxSynchronize failed answered
// EINVAL, "try again after the capture ends", as if a capture were announced: a driver failure
// (a faulted kernel's sticky error) now says so, EDRIVER, and the block stays live.
TEST_F(CAbiFuzzThreadsTest, AFailedSynchronizeBeforeAnUnmapIsADriverFailure) {
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  sim::inject_failure(driver::EntryPoint::ctx_synchronize, 1, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_EDRIVER);
  EXPECT_NE(std::string(expanse_last_error()).find("cuCtxSynchronize failed"), std::string::npos)
      << expanse_last_error();
  sim::clear_injections();
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(p, &of), EXPANSE_OK) << "still live";
  EXPECT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
}

// Found by review: with the reservation at the limit, freeing an exported registrable block
// created its replacement beyond the limit. Now the handle is retired within it, and the
// reservation counts the retired pages as no block's to have.
TEST_F(CAbiFuzzThreadsTest, AnExportedBlockFreedAtTheLimitStaysWithinIt) {
  ASSERT_EQ(expanse_set_limit(0, size_t{512} << 20), EXPANSE_OK) << expanse_last_error();
  size_t got = 0;
  ASSERT_EQ(expanse_reserve(0, size_t{512} << 20, &got), EXPANSE_OK) << expanse_last_error();
  expanse_pool_id id = 0;
  ASSERT_EQ(expanse_pool_create_registrable(0, &id), EXPANSE_OK) << expanse_last_error();
  void* p = expanse_pool_malloc(id, 1 << 20, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_reset_peak_stats(0), EXPANSE_OK);
  ASSERT_EQ(expanse_free_checked(p, 1 << 20, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK);
  EXPECT_LE(s.peak_physical_bytes, size_t{512} << 20) << "never beyond the limit";
  EXPECT_GE(s.physical_low_water_bytes, s.reserved_bytes) << "nor below the reservation";
  EXPECT_EQ(s.reserved_unused_bytes + s.reserve_stranded_bytes, s.reserved_bytes)
      << "the retired pages are no block's";
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_release(id), EXPANSE_OK);
  EXPECT_EQ(expanse_unreserve(0), EXPANSE_OK);
  EXPECT_EQ(expanse_set_limit(0, SIZE_MAX), EXPANSE_OK);
}

void four_threads(bool faults) {
  const size_t ops = env_or("EXPANSE_FUZZ_THREAD_OPS", 1000);
  for (uint64_t seed = 1; seed <= env_or("EXPANSE_FUZZ_THREAD_SEEDS", 2); ++seed) {
    std::vector<std::string> failures(4);
    std::vector<std::thread> threads;
    std::atomic<int> ran{0};
    std::atomic<bool> cleared{false};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        CAbiFuzzer f(t, false, faults);
        SeededChoices c(seed * 16 + static_cast<uint64_t>(t), ops * 8);
        f.run(c, ops);
        // Every thread finishes (frees, closes, wakes) with the faults gone: thread 0 clears
        // them once all have run.
        ran.fetch_add(1);
        if (t == 0) {
          while (ran.load() < 4) std::this_thread::yield();
          sim::clear_injections();
          cleared.store(true);
        }
        while (!cleared.load()) std::this_thread::yield();
        f.finish();
        failures[static_cast<size_t>(t)] = report(f);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(failures[static_cast<size_t>(t)], "") << "seed " << seed << ", thread " << t;
    }
    for (int d = 0; d < 2; ++d) {
      expanse_stats s{};
      s.struct_size = sizeof s;
      ASSERT_EQ(expanse_get_stats(d, &s), EXPANSE_OK);
      EXPECT_EQ(s.requested_bytes, 0u) << "every thread freed its blocks";
    }
  }
}

TEST_F(CAbiFuzzThreadsTest, FourThreadsKeepTheirBlocksUnderMisuse) { four_threads(false); }

TEST_F(CAbiFuzzThreadsTest, FourThreadsKeepTheirBlocksUnderMisuseAndFaults) {
  four_threads(true);
}

}  // namespace
}  // namespace expanse::test::fuzz
