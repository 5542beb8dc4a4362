// Sharing across processes (expanse_ipc_*) and registrable pools through the C ABI: a block
// exported, sent over a socketpair to a child process, imported, checked and written there; the
// exporter freeing an exported block; 10,000 imports and the VA they reserve; what NCCL asks of
// a registrable block (cuMemGetAddressRange, cuMemRetainAllocationHandle); and bad input. Each
// case runs on the in-process sim (driver:sim) and on libexpanse_simcuda.so loaded as the CUDA
// driver (driver:cuda,driver_library:...).
//
// The child is a fresh process (fork, then exec of this test binary with a child-only filter):
// a child forked from a process that initialized CUDA may not use the driver before exec (the
// real driver answers CUDA_ERROR_NOT_INITIALIZED there, and so does the sim; the test
// ForkedChildCannotUseTheDriver checks it).
#include "api/ipc_wire.hpp"
#include "two_drivers_fixture.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr size_t MiB = size_t{1} << 20;

unsigned char pattern_a(size_t i) { return static_cast<unsigned char>(i * 131 + 7); }
unsigned char pattern_b(size_t i) { return static_cast<unsigned char>(i * 29 + 201); }

void fill(void* p, size_t n, unsigned char (*pat)(size_t)) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = pat(i);
}

// The first index where p differs from the pattern, or n.
size_t first_mismatch(const void* p, size_t n, unsigned char (*pat)(size_t)) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != pat(i)) return i;
  }
  return n;
}

// Runs this test binary again as a fresh process with only the child test `test` of the
// IpcChild suite; `fd` (a socket end) stays open across the exec and its number travels in
// EXPANSE_IPC_CHILD_FD, the driver variant in EXPANSE_IPC_CHILD_DRIVER.
pid_t spawn_child(const char* test, int fd, const std::string& driver) {
  const std::string filter = std::string("--gtest_filter=IpcChild.") + test;
  const std::string fd_text = std::to_string(fd);
  const pid_t pid = fork();
  if (pid == 0) {  // only exec-safe work until the exec
    setenv("EXPANSE_IPC_CHILD_FD", fd_text.c_str(), 1);
    setenv("EXPANSE_IPC_CHILD_DRIVER", driver.c_str(), 1);
    unsetenv("EXPANSE_CONF");
    execl("/proc/self/exe", "ipc_child", filter.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Runs child() in a child forked from this process (no exec), which _exit()s with its result.
pid_t fork_only(const std::function<int()>& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 100;
    try {
      code = child();
    } catch (...) {
      code = 101;
    }
    _exit(code);
  }
  return pid;
}

// The child's exit status (128 + signal when it was killed).
int wait_child(pid_t pid) {
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class Ipc : public expanse::test::TwoDrivers {
 protected:
  expanse_pool_id registrable_pool(int device = 0) {
    expanse_pool_id id = 0;
    EXPECT_EQ(expanse_pool_create_registrable(device, &id), EXPANSE_OK) << expanse_last_error();
    return id;
  }
};

// The parent allocates, writes a pattern, exports and sends; the child (a fresh process:
// IpcChild.ImportsChecksWritesAndCloses) imports, checks every byte, writes another pattern and
// closes; the parent sees it.
TEST_P(Ipc, ChildProcessImportsChecksWritesAndCloses) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  const size_t n = 3 * MiB + 100;  // not a whole number of pages
  void* p = expanse_pool_malloc(pool, n, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, n, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_handle_size(&h), n);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t child = spawn_child("ImportsChecksWritesAndCloses", sv[1], GetParam());
  close(sv[1]);
  ASSERT_GT(child, 0);
  EXPECT_EQ(expanse_ipc_send(sv[0], &h), EXPANSE_OK) << expanse_last_error();
  char done = 0;
  EXPECT_EQ(read(sv[0], &done, 1), 1);
  const int status = wait_child(child);
  ASSERT_EQ(status, 0) << "the child process failed (its output is above)";
  close(sv[0]);
  ASSERT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(first_mismatch(p, n, pattern_b), n) << "the parent does not see the child's bytes";
  expanse_free(p, 0, 0, nullptr);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// A child forked (no exec) after the parent initialized the driver may not use it: the real
// driver answers CUDA_ERROR_NOT_INITIALIZED to every call there, cuInit included, and the sim
// does the same, so an allocation in such a child fails instead of touching the parent's books.
TEST_P(Ipc, ForkedChildCannotUseTheDriver) {
  start("sim_capacity:1GiB");
  void* keep = expanse_malloc(2 * MiB, 0, nullptr);
  ASSERT_NE(keep, nullptr) << expanse_last_error();
  const expanse::driver::DriverTable* table = &t();
  const pid_t child = fork_only([&] {
    if (table->init(0) != CUDA_ERROR_NOT_INITIALIZED) return 2;
    int count = 0;
    if (table->device_get_count(&count) != CUDA_ERROR_NOT_INITIALIZED) return 3;
    void* q = expanse_malloc(8 * MiB, 0, nullptr);
    return q == nullptr ? 0 : 4;
  });
  const int status = wait_child(child);
  EXPECT_EQ(status, 0) << "the forked child used the driver (step " << status << ")";
  int count = 0;
  EXPECT_EQ(t().device_get_count(&count), CUDA_SUCCESS) << "the parent lost its driver";
  expanse_free(keep, 0, 0, nullptr);
}

// The exporter frees an exported block and allocates again: the importer still reads its own
// pattern (the freed block's handle was released, never reused), and the new block's handle is
// not the exported one.
TEST_P(Ipc, FreedExportedBlockIsNeverReused) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  const size_t n = 2 * MiB;
  void* p = expanse_pool_malloc(pool, n, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, n, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  // The importer: another process on a GPU; here the same one (a fresh range all the same).
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  ASSERT_NE(q, p);
  CUmemGenericAllocationHandle exported = 0;
  {
    CUcontext ctx = nullptr;
    CUdevice d = 0;
    ASSERT_EQ(t().device_get(&d, 0), CUDA_SUCCESS);
    ASSERT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
    ASSERT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
    ASSERT_EQ(t().mem_retain_allocation_handle(&exported, p), CUDA_SUCCESS);
    ASSERT_EQ(t().mem_release(exported), CUDA_SUCCESS);
    expanse_free(p, 0, 0, nullptr);
    std::vector<void*> fresh;
    for (int i = 0; i < 4; ++i) {
      void* r = expanse_pool_malloc(pool, n, nullptr);
      ASSERT_NE(r, nullptr) << expanse_last_error();
      fill(r, n, pattern_b);
      CUmemGenericAllocationHandle mine = 0;
      ASSERT_EQ(t().mem_retain_allocation_handle(&mine, r), CUDA_SUCCESS);
      EXPECT_NE(mine, exported) << "a new block got the exported block's handle";
      ASSERT_EQ(t().mem_release(mine), CUDA_SUCCESS);
      fresh.push_back(r);
    }
    void* plain = expanse_malloc(n, 0, nullptr);  // the default pool too
    ASSERT_NE(plain, nullptr);
    fill(plain, n, pattern_b);
    EXPECT_EQ(first_mismatch(q, n, pattern_a), n) << "the importer's bytes were overwritten";
    for (void* r : fresh) expanse_free(r, 0, 0, nullptr);
    expanse_free(plain, 0, 0, nullptr);
    EXPECT_EQ(expanse_release_cached(0), EXPANSE_OK);
    EXPECT_EQ(first_mismatch(q, n, pattern_a), n);
    CUcontext popped = nullptr;
    t().ctx_pop_current(&popped);
    t().device_primary_ctx_release(d);
  }
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// What NCCL asks of a buffer (ncclCommRegister, ncclCommWindowRegister): cuMemGetAddressRange on
// any address in a registrable block answers the block (one handle: base = the block, size = its
// extent), and cuMemRetainAllocationHandle the same handle everywhere in it.
TEST_P(Ipc, RegistrableBlockIsOneAllocationForNccl) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* a = expanse_pool_malloc(pool, 5 * MiB + 3, nullptr);
  void* b = expanse_pool_malloc(pool, 1000, nullptr);
  ASSERT_TRUE(a != nullptr && b != nullptr) << expanse_last_error();
  fill(a, 5 * MiB + 3, pattern_a);
  CUcontext ctx = nullptr;
  CUdevice d = 0;
  ASSERT_EQ(t().device_get(&d, 0), CUDA_SUCCESS);
  ASSERT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
  ASSERT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
  const auto base_a = reinterpret_cast<CUdeviceptr>(a);
  for (size_t off : {size_t{0}, size_t{4096}, 3 * MiB + 17, 5 * MiB + 2}) {
    CUdeviceptr base = 0;
    size_t size = 0;
    ASSERT_EQ(t().mem_get_address_range(&base, &size, base_a + off), CUDA_SUCCESS);
    EXPECT_EQ(base, base_a) << "offset " << off;
    EXPECT_EQ(size, 6 * MiB) << "offset " << off;  // 5 MiB + 3 rounded up to 2 MiB pages
  }
  CUmemGenericAllocationHandle h0 = 0, h1 = 0, hb = 0;
  ASSERT_EQ(t().mem_retain_allocation_handle(&h0, a), CUDA_SUCCESS);
  ASSERT_EQ(t().mem_retain_allocation_handle(&h1, static_cast<char*>(a) + 5 * MiB), CUDA_SUCCESS);
  ASSERT_EQ(t().mem_retain_allocation_handle(&hb, b), CUDA_SUCCESS);
  EXPECT_EQ(h0, h1);
  EXPECT_NE(h0, hb);
  CUmemAllocationProp prop{};
  ASSERT_EQ(t().mem_get_allocation_properties_from_handle(&prop, h0), CUDA_SUCCESS);
  EXPECT_NE(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  EXPECT_EQ(prop.allocFlags.gpuDirectRDMACapable, 1);
  for (auto h : {h0, h1, hb}) EXPECT_EQ(t().mem_release(h), CUDA_SUCCESS);
  // Each retain had its own release; the block's own reference keeps it mapped and intact.
  EXPECT_EQ(first_mismatch(a, 5 * MiB + 3, pattern_a), 5 * MiB + 3);
  CUdeviceptr base_after = 0;
  EXPECT_EQ(t().mem_get_address_range(&base_after, nullptr, base_a + 4096), CUDA_SUCCESS);
  EXPECT_EQ(base_after, base_a);
  CUcontext popped = nullptr;
  t().ctx_pop_current(&popped);
  t().device_primary_ctx_release(d);
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(a, &of), EXPANSE_OK);
  EXPECT_EQ(of, pool);
  expanse_pool_stats ps{};
  ps.struct_size = sizeof ps;
  ASSERT_EQ(expanse_pool_get_stats(pool, &ps), EXPANSE_OK);
  EXPECT_EQ(ps.live_blocks, 2u);
  EXPECT_EQ(ps.requested_bytes, 5 * MiB + 3 + 1000);
  EXPECT_EQ(ps.physical_bytes, 8 * MiB);
  expanse_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  EXPECT_EQ(st.live_blocks, 2u);
  EXPECT_EQ(st.physical_bytes, 8 * MiB);
  // A registrable pool cannot sleep: its memory may be mapped elsewhere or registered.
  EXPECT_EQ(expanse_pool_sleep(pool, EXPANSE_SLEEP_OFFLOAD, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("registrable"), std::string::npos)
      << expanse_last_error();
  expanse_free(a, 0, 0, nullptr);
  expanse_free(b, 1000, 0, nullptr);
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.physical_bytes, 0u);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// An import in the exporting process keeps the memory allocated after the exporter frees its
// block, as on a GPU (the memory goes with its last handle and mapping): cuMemGetInfo still
// counts it and a device-sized allocation does not fit; closing the import gives it back.
TEST_P(Ipc, ImportKeepsExportedMemoryCountedAfterTheExporterFrees) {
  start("sim_capacity:64MiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 32 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  expanse_free(p, 0, 0, nullptr);
  CUcontext ctx = nullptr, popped = nullptr;
  CUdevice d = 0;
  ASSERT_EQ(t().device_get(&d, 0), CUDA_SUCCESS);
  ASSERT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
  ASSERT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(t().mem_get_info(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_LE(free_bytes, total - 32 * MiB) << "the import's 32 MiB counted as free";
  void* r = expanse_pool_malloc(pool, 64 * MiB, nullptr);
  EXPECT_EQ(r, nullptr) << "64 MiB fit on a 64 MiB device that still holds 32 MiB";
  if (r != nullptr) expanse_free(r, 0, 0, nullptr);
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(t().mem_get_info(&free_bytes, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, total) << "the last handle went, the memory did not";
  ASSERT_EQ(t().ctx_pop_current(&popped), CUDA_SUCCESS);
  t().device_primary_ctx_release(d);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// A registrable pool released with live blocks waits for them, as a plain pool does: its stats
// count its blocks, not returned, until the last block is freed; then it is forgotten.
TEST_P(Ipc, ReleasedRegistrablePoolWaitsForItsBlocks) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* a = expanse_pool_malloc(pool, MiB, nullptr);
  void* b = expanse_pool_malloc(pool, 3 * MiB, nullptr);
  ASSERT_TRUE(a != nullptr && b != nullptr) << expanse_last_error();
  ASSERT_EQ(expanse_pool_release(pool), EXPANSE_OK) << expanse_last_error();
  expanse_pool_stats ps{};
  ps.struct_size = sizeof ps;
  ASSERT_EQ(expanse_pool_get_stats(pool, &ps), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(ps.released, 1);
  EXPECT_EQ(ps.returned, 0) << "forgotten with live blocks";
  EXPECT_EQ(ps.live_blocks, 2u);
  expanse_free(a, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_get_stats(pool, &ps), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(ps.live_blocks, 1u);
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(b, &of), EXPANSE_OK);
  EXPECT_EQ(of, pool);
  expanse_free(b, 0, 0, nullptr);
  ASSERT_EQ(expanse_pool_get_stats(pool, &ps), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(ps.returned, 1) << "not forgotten after its last block";
  EXPECT_EQ(ps.live_blocks, 0u);
}

// EXPANSE_CONF registrable:on: every default-pool block is registrable, so any of them exports.
TEST_P(Ipc, RegistrableConfExportsDefaultPoolBlocks) {
  start("sim_capacity:1GiB,registrable:on");
  void* p = expanse_malloc(MiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, MiB, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(first_mismatch(q, MiB, pattern_a), size_t{MiB});
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  expanse_free(p, MiB, 0, nullptr);
}

// Bad input is a clear error that changes nothing and leaks nothing (TearDown: the sim holds
// nothing after shutdown).
TEST_P(Ipc, BadInputIsAClearErrorAndLeaksNothing) {
  start("sim_devices:2,sim_capacity:1GiB");
  auto error_has = [](const char* what) {
    return std::string(expanse_last_error()).find(what) != std::string::npos;
  };
  expanse_ipc_handle h;
  std::memset(&h, 0, sizeof h);
  // A block of the default pool (its pages may be shared), a foreign pointer, an interior one.
  void* plain = expanse_malloc(MiB, 0, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(expanse_ipc_export(plain, &h), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("registrable")) << expanse_last_error();
  int local = 0;
  EXPECT_EQ(expanse_ipc_export(&local, &h), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("not a live block")) << expanse_last_error();
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 2 * MiB, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(expanse_ipc_export(static_cast<char*>(p) + 4096, &h), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("interior pointer")) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_export(p, nullptr), EXPANSE_EINVAL);
  // A handle never filled, a released one, one whose fd was closed.
  void* q = nullptr;
  EXPECT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("not an expanse_ipc_handle")) << expanse_last_error();
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  expanse_ipc_handle copy = h;
  ASSERT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);  // twice: harmless
  EXPECT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("released")) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_import(&copy, 0, &q), EXPANSE_EINVAL);  // its fd was closed with h's
  EXPECT_TRUE(error_has("not open")) << expanse_last_error();
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(expanse_ipc_handle_size(&h), 0u);
  // Memory of device 0 imported on device 1.
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_import(&h, 1, &q), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("device 0")) << expanse_last_error();
  EXPECT_EQ(q, nullptr);
  // A close of what was not imported; a receive from a peer that closed; a send to nobody.
  EXPECT_EQ(expanse_ipc_close(p), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("not an address expanse_ipc_import returned")) << expanse_last_error();
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  close(sv[1]);
  expanse_ipc_handle got;
  EXPECT_EQ(expanse_ipc_recv(sv[0], &got), EXPANSE_EINVAL);
  EXPECT_TRUE(error_has("closed")) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_send(sv[0], &h), EXPANSE_EINVAL);
  close(sv[0]);
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  // The block itself was never harmed.
  expanse_free(p, 2 * MiB, 0, nullptr);
  expanse_free(plain, MiB, 0, nullptr);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// The open file descriptors of this process.
int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// A handle whose sizes were damaged (or forged) is refused by import, naming the field, with
// nothing reserved, imported or kept open; an offset inside the first handle is honoured and
// close takes the address import returned.
TEST_P(Ipc, ImportChecksTheHandlesSizesAndOffset) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 2 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, 2 * MiB, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  auto* w = reinterpret_cast<expanse::api::IpcWire*>(&h);
  const expanse::api::IpcWire good = *w;
  expanse_stats before{};
  before.struct_size = sizeof before;
  ASSERT_EQ(expanse_get_stats(0, &before), EXPANSE_OK);
  const int fds = open_fds();
  auto refused = [&](const char* field) {
    void* q = nullptr;
    EXPECT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_EINVAL) << field;
    EXPECT_EQ(q, nullptr) << field;
    EXPECT_NE(std::string(expanse_last_error()).find(field), std::string::npos)
        << expanse_last_error();
    expanse_stats st{};
    st.struct_size = sizeof st;
    ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
    EXPECT_EQ(st.va_reserved_bytes, before.va_reserved_bytes) << field;
    EXPECT_EQ(open_fds(), fds) << field;
    *w = good;
  };
  w->offset = 64 * MiB;
  refused("offset");
  w->offset = 2 * MiB;  // one past the handle
  refused("offset");
  w->size = uint64_t{1} << 40;
  refused("size");
  w->size = 0;
  refused("size");
  w->handle_bytes[0] = 4 * MiB;  // more than the handle holds: the driver will not map it
  w->size = 4 * MiB;
  refused("handle_bytes[0]");
  w->handle_bytes[0] = MiB + 4096;  // not whole granules
  w->size = 4096;
  refused("handle_bytes[0]");
  w->handle_bytes[0] = 0;
  refused("handle_bytes[0]");
  // An offset inside the first handle: the address is base + offset, and close takes it.
  w->offset = 4096;
  w->size = 2 * MiB - 4096;
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(static_cast<unsigned char*>(q)[0], pattern_a(4096));
  EXPECT_EQ(expanse_ipc_close(static_cast<char*>(q) - 4096), EXPANSE_EINVAL);
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  *w = good;
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  expanse_free(p, 0, 0, nullptr);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// A registrable block's handle is unmapped at its free, so the free waits for the device's work
// (invariant 3); while a capture is announced that wait cannot happen: the free is refused and
// the block stays live and intact, and frees once the capture has ended.
TEST_P(Ipc, RegistrableFreeDuringAnnouncedCaptureIsRefused) {
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, MiB, pattern_a);
  CUcontext ctx = nullptr;
  CUdevice d = 0;
  ASSERT_EQ(t().device_get(&d, 0), CUDA_SUCCESS);
  ASSERT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
  ASSERT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
  ASSERT_EQ(expanse_capture_begin(nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(p, MiB, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("capture"), std::string::npos)
      << expanse_last_error();
  EXPECT_EQ(first_mismatch(p, MiB, pattern_a), size_t{MiB});
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(p, &of), EXPANSE_OK) << "the refused free changed the block";
  ASSERT_EQ(expanse_capture_end(nullptr), EXPANSE_OK);
  EXPECT_EQ(expanse_free_checked(p, MiB, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  CUcontext popped = nullptr;
  t().ctx_pop_current(&popped);
  t().device_primary_ctx_release(d);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// Invariant 3 for registrable blocks: work queued on the block (a memset on a held stream) is
// done before the free unmaps the handle, so it never runs on unmapped memory (the sim counts such
// work as an illegal-address fault).
TEST_P(Ipc, RegistrableFreeWaitsForPendingWork) {
  if (dlopened()) GTEST_SKIP() << "holds streams through the in-process sim's controls";
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  CUcontext ctx = nullptr;
  CUdevice d = 0;
  ASSERT_EQ(t().device_get(&d, 0), CUDA_SUCCESS);
  ASSERT_EQ(t().device_primary_ctx_retain(&ctx, d), CUDA_SUCCESS);
  ASSERT_EQ(t().ctx_push_current(ctx), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(t().stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* p = expanse_pool_malloc(pool, 2 * MiB, reinterpret_cast<CUstream_st*>(s));
  ASSERT_NE(p, nullptr) << expanse_last_error();
  const uint64_t faults = expanse::sim::async_faults();
  expanse::sim::hold_stream(s);
  ASSERT_EQ(t().memset_d8_async(reinterpret_cast<CUdeviceptr>(p), 0x11, 2 * MiB, s),
            CUDA_SUCCESS);
  EXPECT_EQ(expanse_free_checked(p, 0, 0, reinterpret_cast<CUstream_st*>(s)), EXPANSE_OK)
      << expanse_last_error();
  expanse::sim::release_all();
  EXPECT_EQ(expanse::sim::async_faults(), faults) << "the memset ran after the unmap";
  ASSERT_EQ(t().stream_destroy(s), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  t().ctx_pop_current(&popped);
  t().device_primary_ctx_release(d);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// A peer device granted access (peer_access:auto) may run work on a registrable block: a held
// memset on a device-1 stream, named with record_stream, is done before the free unmaps the
// handle; while a capture is announced in device 1's context the free is refused, the block
// live and intact.
TEST_P(Ipc, RegistrableFreeWaitsForPeerDeviceWork) {
  if (dlopened()) GTEST_SKIP() << "holds streams through the in-process sim's controls";
  start("sim_devices:2,sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 2 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, 2 * MiB, pattern_a);
  CUdevice d1 = 0;
  CUcontext c1 = nullptr, popped = nullptr;
  ASSERT_EQ(t().device_get(&d1, 1), CUDA_SUCCESS);
  ASSERT_EQ(t().device_primary_ctx_retain(&c1, d1), CUDA_SUCCESS);
  // A capture announced in device 1's context: the free cannot wait for its work.
  ASSERT_EQ(t().ctx_push_current(c1), CUDA_SUCCESS);
  ASSERT_EQ(expanse_capture_begin(nullptr), EXPANSE_OK);
  ASSERT_EQ(t().ctx_pop_current(&popped), CUDA_SUCCESS);
  EXPECT_EQ(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_EINVAL);
  EXPECT_NE(std::string(expanse_last_error()).find("capture"), std::string::npos)
      << expanse_last_error();
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(p, &of), EXPANSE_OK) << "the refused free changed the block";
  EXPECT_EQ(first_mismatch(p, 2 * MiB, pattern_a), 2 * MiB);
  ASSERT_EQ(t().ctx_push_current(c1), CUDA_SUCCESS);
  ASSERT_EQ(expanse_capture_end(nullptr), EXPANSE_OK);
  // Work of device 1 on the block, held, then the free.
  CUstream s1 = nullptr;
  ASSERT_EQ(t().stream_create(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const uint64_t faults = expanse::sim::async_faults();
  expanse::sim::hold_stream(s1);
  ASSERT_EQ(t().memset_d8_async(reinterpret_cast<CUdeviceptr>(p), 0x11, 2 * MiB, s1),
            CUDA_SUCCESS);
  EXPECT_EQ(expanse_record_stream(p, reinterpret_cast<CUstream_st*>(s1)), EXPANSE_OK)
      << expanse_last_error();
  ASSERT_EQ(t().ctx_pop_current(&popped), CUDA_SUCCESS);
  EXPECT_EQ(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  expanse::sim::release_all();
  EXPECT_EQ(expanse::sim::async_faults(), faults) << "device 1's memset ran after the unmap";
  ASSERT_EQ(t().ctx_push_current(c1), CUDA_SUCCESS);
  EXPECT_EQ(t().stream_destroy(s1), CUDA_SUCCESS);
  ASSERT_EQ(t().ctx_pop_current(&popped), CUDA_SUCCESS);
  t().device_primary_ctx_release(d1);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// A failed unmap at a registrable block's free or an import's close keeps the books right: the
// block (or import) stays live and intact with its handle, the error is returned, and a later
// free (close) succeeds; nothing leaks (TearDown: the sim holds nothing after shutdown).
TEST_P(Ipc, FailedUnmapKeepsTheBlockAndTheImport) {
  if (dlopened()) GTEST_SKIP() << "injects failures through the in-process sim";
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 2 * MiB, nullptr);
  ASSERT_NE(p, nullptr) << expanse_last_error();
  fill(p, 2 * MiB, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  using expanse::driver::EntryPoint;
  expanse::sim::inject_failure(EntryPoint::mem_unmap, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_NE(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_OK);
  expanse_pool_id of = 0;
  EXPECT_EQ(expanse_pool_of(p, &of), EXPANSE_OK) << "the block was forgotten";
  EXPECT_EQ(first_mismatch(p, 2 * MiB, pattern_a), 2 * MiB);
  expanse_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  EXPECT_EQ(st.live_blocks, 1u);
  expanse::sim::inject_failure(EntryPoint::mem_unmap, 1, CUDA_ERROR_UNKNOWN);
  EXPECT_NE(expanse_ipc_close(q), EXPANSE_OK);
  EXPECT_EQ(first_mismatch(q, 2 * MiB, pattern_a), 2 * MiB) << "the import was unmapped";
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << "the import was forgotten: "
                                               << expanse_last_error();
  EXPECT_EQ(expanse_free_checked(p, 0, 0, nullptr), EXPANSE_OK) << expanse_last_error();
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.physical_bytes, 0u);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

// 10,000 imports of 2 MiB blocks reserve about the bytes imported (1.05x at most), not a
// device's worth each; closing them gives it all back.
TEST_P(Ipc, TenThousandImportsReserveOnlyTheirExtent) {
  if (dlopened()) GTEST_SKIP() << "the in-process sim's books count the VA";
  constexpr int kImports = 10000;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < kImports + 256 && lim.rlim_max >= kImports + 256) {
    lim.rlim_cur = kImports + 256;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < kImports + 256) {
    GTEST_SKIP() << "the sim keeps one fd per import: needs " << kImports + 256
                 << " open files, the limit is " << lim.rlim_cur;
  }
  start("sim_capacity:1GiB");
  const expanse_pool_id pool = registrable_pool();
  void* p = expanse_pool_malloc(pool, 2 * MiB, nullptr);
  ASSERT_NE(p, nullptr);
  fill(p, 2 * MiB, pattern_a);
  expanse_ipc_handle h;
  ASSERT_EQ(expanse_ipc_export(p, &h), EXPANSE_OK) << expanse_last_error();
  const size_t before = expanse::sim::outstanding().reserved_bytes;
  std::vector<void*> imported;
  for (int i = 0; i < kImports; ++i) {
    void* q = nullptr;
    ASSERT_EQ(expanse_ipc_import(&h, 0, &q), EXPANSE_OK) << i << ": " << expanse_last_error();
    imported.push_back(q);
  }
  const size_t reserved = expanse::sim::outstanding().reserved_bytes - before;
  const double bytes = double(kImports) * double(2 * MiB);
  std::printf("%d imports of 2 MiB: %zu bytes of VA reserved for %.0f bytes imported (%.4fx)\n",
              kImports, reserved, bytes, double(reserved) / bytes);
  EXPECT_LE(double(reserved), 1.05 * bytes);
  expanse_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(expanse_get_stats(0, &st), EXPANSE_OK);
  EXPECT_LE(double(st.va_reserved_bytes), 1.05 * bytes + double(4 * MiB) + double(before));
  EXPECT_EQ(first_mismatch(imported.back(), 2 * MiB, pattern_a), 2 * MiB);
  for (void* q : imported) ASSERT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse::sim::outstanding().reserved_bytes, before);
  EXPECT_EQ(expanse_ipc_handle_release(&h), EXPANSE_OK);
  expanse_free(p, 0, 0, nullptr);
  EXPECT_EQ(expanse_pool_release(pool), EXPANSE_OK);
}

INSTANTIATE_TEST_SUITE_P(Drivers, Ipc, ::testing::Values("sim", "simcuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ---- the child processes' side (skipped unless this binary runs as a child) ----------------

// Starts expanse in a child process on the driver variant the parent named; *lib gets the
// simcuda library when it was loaded.
bool start_child(const std::string& driver, void** lib) {
  const char* conf = "sim_capacity:1GiB";
  if (driver == "simcuda") {
    *lib = dlopen(EXPANSE_SIMCUDA_PATH, RTLD_NOW | RTLD_LOCAL);
    if (*lib == nullptr) return false;
    auto configure = reinterpret_cast<int (*)(const char*)>(dlsym(*lib, "expanse_sim_configure"));
    if (configure == nullptr || configure(conf) != 0) return false;
    const std::string full =
        "driver:cuda,driver_library:" + std::string(EXPANSE_SIMCUDA_PATH) + "," + conf;
    return expanse_init(full.c_str()) == EXPANSE_OK;
  }
  return expanse_init((std::string("driver:sim,") + conf).c_str()) == EXPANSE_OK;
}

// Receives a handle on the inherited socket, imports it, checks the parent's pattern over the
// whole block, writes the other pattern, closes, releases and says done.
TEST(IpcChild, ImportsChecksWritesAndCloses) {
  const char* fd_text = std::getenv("EXPANSE_IPC_CHILD_FD");
  if (fd_text == nullptr) GTEST_SKIP() << "runs in a child process the parent test starts";
  const int fd = std::atoi(fd_text);
  void* lib = nullptr;
  ASSERT_TRUE(start_child(std::getenv("EXPANSE_IPC_CHILD_DRIVER"), &lib)) << expanse_last_error();
  expanse_ipc_handle got;
  ASSERT_EQ(expanse_ipc_recv(fd, &got), EXPANSE_OK) << expanse_last_error();
  const size_t n = expanse_ipc_handle_size(&got);
  ASSERT_GT(n, 0u);
  void* q = nullptr;
  ASSERT_EQ(expanse_ipc_import(&got, 0, &q), EXPANSE_OK) << expanse_last_error();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(first_mismatch(q, n, pattern_a), n);
  fill(q, n, pattern_b);
  EXPECT_EQ(expanse_ipc_close(q), EXPANSE_OK) << expanse_last_error();
  EXPECT_EQ(expanse_ipc_handle_release(&got), EXPANSE_OK);
  const char done = 'k';
  EXPECT_EQ(write(fd, &done, 1), 1);
  EXPECT_EQ(expanse_shutdown(), EXPANSE_OK) << expanse_last_error();
  if (lib != nullptr) dlclose(lib);
}

}  // namespace
