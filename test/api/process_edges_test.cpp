// Process edges, each in a process of its own: a child forked after expanse initialised the driver
// is told so by every entry point (and touches nothing: no driver call, no lock its parent's
// threads held at the fork), and a process that exits with blocks live, pools asleep, imports
// open and thread caches full (threads still running among them) ends cleanly: no hang, no crash
// in a destructor. The exits run as gtest death tests in the "threadsafe" style: the child is a
// fresh exec of this binary, so nothing of the parent's runtime is in it.
#include "expanse/expanse.h"
#include "expanse/expanse.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr const char* kConf = "driver:sim,sim_devices:2,sim_capacity:1GiB,sim_posix_fd:true";

// Runs body in a child forked from this process; what it writes to its fd comes back in *said.
// The child's exit status, 128 + the signal that killed it, or -1 if it ran past `seconds` (then
// it is killed: a hang).
int run_forked(const std::function<void(int fd)>& body, int seconds, std::string* said) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -2;
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    int code = 0;
    try {
      body(pipe_fds[1]);
    } catch (...) {
      code = 3;
    }
    _exit(code);
  }
  close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  bool hung = true;
  for (int waited_ms = 0; waited_ms < seconds * 1000;) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int r = poll(&p, 1, 100);
    waited_ms += 100;
    if (r > 0) {
      const ssize_t n = read(pipe_fds[0], buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      hung = false;  // the child closed its end: it is exiting
      break;
    }
  }
  close(pipe_fds[0]);
  if (hung) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  *said = out;
  if (hung) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void say(int fd, const std::string& s) {
  const std::string line = s + "\n";
  (void)!write(fd, line.data(), line.size());
}

// Every entry point that could reach the driver or the allocator's books, called in the child as
// a careless program would: each must fail with EXPANSE_EDRIVER and a message naming the fork.
void call_everything(int fd, void* live, expanse_pool_id pool, expanse_pool_id sleeping,
                     void* imported, expanse_ipc_handle* exported) {
  auto check = [&](const char* what, int rc, int want = EXPANSE_EDRIVER) {
    if (rc != want) {
      say(fd, std::string(what) + " answered " + std::to_string(rc));
    } else if (std::strstr(expanse_last_error(), "forked") == nullptr) {
      say(fd, std::string(what) + ": the message does not say why: " + expanse_last_error());
    }
  };
  void* p = reinterpret_cast<void*>(1);
  check("expanse_malloc_checked", expanse_malloc_checked(&p, MiB, 0, nullptr));
  if (p != nullptr) say(fd, "expanse_malloc_checked gave a pointer");
  if (expanse_malloc(MiB, 0, nullptr) != nullptr) say(fd, "expanse_malloc gave a pointer");
  check("expanse_malloc", EXPANSE_EDRIVER);
  expanse_free(live, MiB, 0, nullptr);
  check("expanse_free_checked", expanse_free_checked(live, 0, 0, nullptr));
  check("expanse_record_stream", expanse_record_stream(live, nullptr));
  check("expanse_release_cached", expanse_release_cached(0));
  check("expanse_capture_begin", expanse_capture_begin(nullptr));
  check("expanse_capture_end", expanse_capture_end(nullptr));
  check("expanse_set_limit", expanse_set_limit(0, 64 * MiB));
  size_t got = 0;
  check("expanse_reserve", expanse_reserve(0, 64 * MiB, &got));
  check("expanse_unreserve", expanse_unreserve(0));
  expanse_stats s{};
  s.struct_size = sizeof s;
  check("expanse_get_stats", expanse_get_stats(0, &s));
  check("expanse_reset_peak_stats", expanse_reset_peak_stats(0));
  check("expanse_init", expanse_init(kConf));
  check("expanse_shutdown", expanse_shutdown());
  if (expanse_driver_description() != nullptr) say(fd, "expanse_driver_description answered");
  check("expanse_driver_description", EXPANSE_EDRIVER);
  if (expanse_device_count() != -1) say(fd, "expanse_device_count answered");
  check("expanse_device_count", EXPANSE_EDRIVER);
  expanse_pool_id id = 0;
  check("expanse_pool_create", expanse_pool_create(0, &id));
  check("expanse_pool_create_registrable", expanse_pool_create_registrable(0, &id));
  check("expanse_pool_retain", expanse_pool_retain(pool));
  check("expanse_pool_release", expanse_pool_release(pool));
  check("expanse_pool_begin_capture", expanse_pool_begin_capture(pool, nullptr));
  check("expanse_pool_begin_thread", expanse_pool_begin_thread(pool));
  check("expanse_pool_end", expanse_pool_end(pool));
  if (expanse_pool_malloc(pool, MiB, nullptr) != nullptr) say(fd, "expanse_pool_malloc answered");
  check("expanse_pool_malloc", EXPANSE_EDRIVER);
  check("expanse_pool_trim", expanse_pool_trim(pool));
  check("expanse_pool_of", expanse_pool_of(live, &id));
  expanse_pool_stats ps{};
  ps.struct_size = sizeof ps;
  check("expanse_pool_get_stats", expanse_pool_get_stats(pool, &ps));
  check("expanse_pool_sleep", expanse_pool_sleep(pool, EXPANSE_SLEEP_OFFLOAD, nullptr));
  check("expanse_pool_wake", expanse_pool_wake(sleeping, nullptr));
  check("expanse_pool_is_asleep", -expanse_pool_is_asleep(sleeping));
  check("expanse_release_host_backup", expanse_release_host_backup(0));
  check("expanse_set_wake_hook", expanse_set_wake_hook(nullptr, nullptr));
  check("expanse_record_history", expanse_record_history(1, 100));
  check("expanse_dump_snapshot", expanse_dump_snapshot("/tmp/expanse-forked-child.pickle"));
  size_t segments = 0, blocks = 0;
  check("expanse_get_segments", expanse_get_segments(0, nullptr, &segments, nullptr, &blocks));
  size_t entries = 0;
  check("expanse_get_trace", expanse_get_trace(0, nullptr, &entries));
  expanse_ipc_handle h{};
  check("expanse_ipc_export", expanse_ipc_export(live, &h));
  void* q = nullptr;
  check("expanse_ipc_import", expanse_ipc_import(exported, 0, &q));
  if (q != nullptr) say(fd, "expanse_ipc_import gave a pointer");
  check("expanse_ipc_close", expanse_ipc_close(imported));
  check("expanse_enable_peer_access", expanse_enable_peer_access(0, 1));
  // The C++ facade's way in (init and shutdown go around the C ABI's wrapper).
  for (int k = 0; k < 2; ++k) {
    try {
      if (k == 0) {
        expanse::init(kConf);
      } else {
        expanse::shutdown();
      }
      say(fd, k == 0 ? "expanse::init succeeded" : "expanse::shutdown succeeded");
    } catch (const expanse::driver_failure& e) {
      if (std::strstr(e.what(), "forked") == nullptr) say(fd, std::string("C++: ") + e.what());
    } catch (...) {
      say(fd, "the C++ facade threw something other than driver_failure");
    }
  }
  // Pure: they reach neither the driver nor the books, and work as anywhere.
  if (expanse_entry_point_name(0) == nullptr) say(fd, "expanse_entry_point_name failed");
  if (expanse_ipc_handle_size(exported) == 0) say(fd, "expanse_ipc_handle_size failed");
}

TEST(ProcessEdges, AChildForkedAfterInitIsToldByEveryEntryPointAndTheParentGoesOn) {
  ASSERT_EQ(expanse_init(kConf), EXPANSE_OK) << expanse_last_error();
  void* live = expanse_malloc(MiB, 0, nullptr);
  ASSERT_NE(live, nullptr) << expanse_last_error();
  std::memset(live, 0x5a, MiB);
  expanse_pool_id pool = 0, sleeping = 0, registrable = 0;
  ASSERT_EQ(expanse_pool_create(0, &pool), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_pool_create(0, &sleeping), EXPANSE_OK) << expanse_last_error();
  void* asleep = expanse_pool_malloc(sleeping, 4 * MiB, nullptr);
  ASSERT_NE(asleep, nullptr) << expanse_last_error();
  ASSERT_EQ(expanse_pool_sleep(sleeping, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_OK)
      << expanse_last_error();
  ASSERT_EQ(expanse_pool_create_registrable(0, &registrable), EXPANSE_OK) << expanse_last_error();
  void* shared = expanse_pool_malloc(registrable, 2 * MiB, nullptr);
  ASSERT_NE(shared, nullptr) << expanse_last_error();
  expanse_ipc_handle h{};
  ASSERT_EQ(expanse_ipc_export(shared, &h), EXPANSE_OK) << expanse_last_error();
  void* imported = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &imported), EXPANSE_OK) << expanse_last_error();

  std::string said;
  const int status = run_forked(
      [&](int fd) { call_everything(fd, live, pool, sleeping, imported, &h); }, 60, &said);
  EXPECT_EQ(status, 0) << "-1: the child hung";
  EXPECT_EQ(said, "");

  // The parent's state is as it was, and its calls work.
  expanse_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(expanse_get_stats(0, &s), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(s.live_blocks, 3u);  // the import is not a block
  EXPECT_EQ(static_cast<unsigned char*>(live)[MiB - 1], 0x5a);
  EXPECT_EQ(expanse_ipc_close(imported), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(shared, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_wake(sleeping, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_free_checked(asleep, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_free_checked(live, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_release(sleeping), EXPANSE_OK);
  EXPECT_EQ(expanse_pool_release(registrable), EXPANSE_OK);
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
}

// ---- exits ------------------------------------------------------------------------------------

// A hang becomes SIGALRM, not ExitedWithCode(0).
void start_exit_child() {
  alarm(30);
  if (expanse_init(kConf) != EXPANSE_OK) std::_Exit(90);
}

void leave_live_blocks() {
  for (int d = 0; d < 2; ++d) {
    for (size_t size : {size_t{512}, 3 * MiB, 64 * MiB + 1}) {
      if (expanse_malloc(size, d, nullptr) == nullptr) std::_Exit(91);
    }
  }
}

void leave_a_sleeping_pool() {
  expanse_pool_id id = 0;
  if (expanse_pool_create(1, &id) != EXPANSE_OK) std::_Exit(92);
  void* p = expanse_pool_malloc(id, 8 * MiB, nullptr);
  if (p == nullptr) std::_Exit(93);
  std::memset(p, 1, 8 * MiB);
  if (expanse_pool_sleep(id, EXPANSE_SLEEP_OFFLOAD, nullptr) != EXPANSE_OK) std::_Exit(94);
}

void leave_an_import() {
  expanse_pool_id id = 0;
  if (expanse_pool_create_registrable(0, &id) != EXPANSE_OK) std::_Exit(95);
  void* p = expanse_pool_malloc(id, 2 * MiB, nullptr);
  if (p == nullptr) std::_Exit(96);
  static expanse_ipc_handle h{};  // exported, never released
  void* q = nullptr;
  if (expanse_ipc_export(p, &h) != EXPANSE_OK || expanse_ipc_import(&h, 0, &q) != EXPANSE_OK) {
    std::_Exit(97);
  }
}

// Small blocks freed on threads still running at the exit (their caches hold them), on one that
// ended (its cache flushed), and on this one.
void leave_thread_caches() {
  static std::atomic<int> ready{0};
  auto churn = [] {
    std::vector<void*> v;
    for (int i = 0; i < 64; ++i) v.push_back(expanse_malloc(256 + 64 * static_cast<size_t>(i), 0, nullptr));
    for (void* p : v) expanse_free(p, 0, 0, nullptr);
  };
  for (int t = 0; t < 3; ++t) {
    std::thread([&] {
      churn();
      ready.fetch_add(1);
      // Still running when the process exits (a static condition variable here would hang the
      // exit itself: glibc's destructor waits for its waiters).
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }).detach();
  }
  std::thread(churn).join();
  churn();
  while (ready.load() < 3) std::this_thread::yield();
}

class ProcessExit : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ProcessExit, WithLiveBlocksEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_live_blocks();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ProcessExit, WithASleepingPoolEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_a_sleeping_pool();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ProcessExit, WithAnImportOpenEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_an_import();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ProcessExit, WithThreadCachesFullAndThreadsRunningEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_thread_caches();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ProcessExit, WithEverythingAtOnceEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_live_blocks();
        leave_a_sleeping_pool();
        leave_an_import();
        leave_thread_caches();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// Returning from main with everything live (static destructors and atexit handlers run after
// main's locals are gone) is exit() too; a child calling exit() from another thread is the other
// way out a program takes.
TEST_F(ProcessExit, FromAnotherThreadWithEverythingLiveEndsCleanly) {
  EXPECT_EXIT(
      {
        start_exit_child();
        leave_live_blocks();
        leave_thread_caches();
        std::thread([] { std::exit(0); }).join();
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
