// Sharing records treated as hostile input: an expanse_ipc_handle comes from another process (a
// Unix socket, its fds by SCM_RIGHTS, sizes and an offset it claims), so each trial takes a
// genuine record of an exported block and lies in one way before importing it: a field changed
// (handle_bytes, size, offset, num_handles, magic, version, handle_type, state, device), an fd of
// the wrong kind (a regular file, a socket, a pipe, /dev/null, a memfd of another size named as
// the sim names its handles, another block's handle, a closed number), random bytes over the
// record, or on the socket a truncated, oversized, duplicated message, too many or too few fds,
// a peer that hung up. After each: no crash (a mapping beyond what the handles hold would be read
// and fault), an import that succeeds reads what it should, a refusal is EXPANSE_EINVAL with a
// message naming the field lied about, no fd is leaked, and the exported blocks keep their bytes.
// Choices come from a seed (ipc_record_fuzz_test.cpp) or libFuzzer (test/fuzz/fuzz_c_abi.cpp).
#pragma once

#include "expanse/expanse.h"
#include "fuzz_choices.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace expanse::test::fuzz {

// expanse_ipc_handle's layout (src/api/ipc_wire.hpp), as a peer sees the bytes it sends.
struct RecordBytes {
  uint32_t magic;
  uint16_t version;
  uint16_t handle_type;
  int32_t device;
  uint32_t num_handles;
  uint64_t size;
  uint64_t offset;
  uint64_t exporter_pid;
  uint64_t exporter_address;
  uint64_t handle_bytes[4];
  int32_t fds[4];
  uint32_t state;
  uint32_t reserved[7];
};
static_assert(sizeof(RecordBytes) == EXPANSE_IPC_HANDLE_SIZE, "the record's layout");

class IpcRecordFuzzer {
 public:
  // After expanse_init with POSIX fds on the sim: exports blocks of a few sizes from a
  // registrable pool on device 0.
  IpcRecordFuzzer() {
    if (expanse_pool_create_registrable(0, &pool_) != EXPANSE_OK) {
      fail(std::string("pool: ") + expanse_last_error());
      return;
    }
    for (size_t size : {size_t{1} << 20, size_t{5} << 20, (size_t{2} << 20) + 4096}) {
      Genuine g;
      g.size = size;
      g.ptr = expanse_pool_malloc(pool_, size, nullptr);
      if (g.ptr == nullptr || expanse_ipc_export(g.ptr, &g.handle) != EXPANSE_OK) {
        fail(std::string("export: ") + expanse_last_error());
        return;
      }
      g.seed = 0x9e3779b97f4a7c15ull * (genuine_.size() + 1);
      fill(g.ptr, size, g.seed);
      genuine_.push_back(g);
    }
    // Device 1 set up now: its first use opens the sim's memory file, not a leak.
    if (void* p = expanse_malloc(1, 1, nullptr)) expanse_free(p, 1, 1, nullptr);
    fds_before_ = open_fds();
  }
  ~IpcRecordFuzzer() { finish(); }

  void run(Choices& c, size_t trials) {
    for (size_t i = 0; i < trials && !c.done() && !genuine_.empty(); ++i) trial(c);
  }

  // Releases what the constructor made; checks nothing leaked. Idempotent.
  void finish() {
    for (Genuine& g : genuine_) {
      if (!holds(g.ptr, g.size, g.seed)) fail("an exported block lost its bytes");
      expanse_ipc_handle_release(&g.handle);
      if (expanse_free_checked(g.ptr, g.size, 0, nullptr) != EXPANSE_OK) {
        fail(std::string("free: ") + expanse_last_error());
      }
    }
    genuine_.clear();
    if (pool_ != 0) expanse_pool_release(pool_);
    pool_ = 0;
  }

  const std::vector<std::string>& failures() const { return failures_; }
  size_t trials() const { return trials_; }
  size_t imported() const { return imported_; }
  size_t refused() const { return refused_; }

 private:
  struct Genuine {
    void* ptr = nullptr;
    size_t size = 0;
    uint64_t seed = 0;
    expanse_ipc_handle handle{};
  };
  // What a lie must be refused for (any of these words in the message), or that it may pass.
  struct Expect {
    std::vector<const char*> names;  // empty: must succeed
    bool may_pass = false;           // the lie keeps the record importable
    bool same_bytes = true;          // a success reads the genuine block's bytes at its start
  };

  void fail(const std::string& what) {
    failures_.push_back("trial " + std::to_string(trials_) + " (" + kind_ + "): " + what);
  }

  static uint64_t word(uint64_t seed, size_t i) { return seed ^ (0xbf58476d1ce4e5b9ull * (i + 1)); }
  static void fill(void* p, size_t size, uint64_t seed) {
    for (size_t at : {size_t{0}, size / 2, size - 8}) {
      const uint64_t w = word(seed, at);
      std::memcpy(static_cast<char*>(p) + at, &w, 8);
    }
  }
  static bool holds(const void* p, size_t size, uint64_t seed) {
    for (size_t at : {size_t{0}, size / 2, size - 8}) {
      const uint64_t w = word(seed, at);
      if (std::memcmp(static_cast<const char*>(p) + at, &w, 8) != 0) return false;
    }
    return true;
  }
  static size_t open_fds() {
    size_t n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (readdir(d) != nullptr) ++n;
      closedir(d);
    }
    return n;
  }

  // An fd of the wrong kind, owned by the record from here (released with it).
  int wrong_fd(Choices& c) {
    switch (c.pick(8)) {
      case 0: {
        FILE* f = std::tmpfile();
        if (f == nullptr) return -1;
        const int fd = dup(fileno(f));
        std::fclose(f);
        kind_ += ", a regular file";
        return fd;
      }
      case 1: {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
        close(sv[1]);
        kind_ += ", a socket";
        return sv[0];
      }
      case 2: {
        int p[2];
        if (pipe(p) != 0) return -1;
        close(p[1]);
        kind_ += ", a pipe";
        return p[0];
      }
      case 3: {
        kind_ += ", /dev/null";
        return open("/dev/null", O_RDWR | O_CLOEXEC);
      }
      case 4: {
        // A memfd named as the sim names its handles, of another size: the sim takes it for one.
        const int fd = memfd_create("expanse-sim-handle-d0", MFD_CLOEXEC);
        if (fd >= 0 && ftruncate(fd, static_cast<off_t>((1 + c.pick(8)) << 21) - 4096 *
                                           static_cast<off_t>(c.pick(2))) != 0) {
          close(fd);
          return -1;
        }
        kind_ += ", a memfd named as a handle";
        return fd;
      }
      case 5: {
        const Genuine& other = genuine_[c.pick(genuine_.size())];
        kind_ += ", another block's handle";
        const int fd = reinterpret_cast<const RecordBytes*>(&other.handle)->fds[0];
        return fcntl(fd, F_DUPFD_CLOEXEC, 0);
      }
      case 6: {
        const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        close(fd);  // a number that is not open
        kind_ += ", a closed fd";
        return fd;
      }
      default:
        kind_ += ", -1";
        return -1;
    }
  }

  // Sends bytes (n of the record's, or more) with fds over a fresh Unix socket pair of `type`
  // and receives them with expanse_ipc_recv; returns its code.
  int through_socket(const RecordBytes& r, size_t n, const std::vector<int>& fds, int type,
                     bool twice, bool hang_up, expanse_ipc_handle* out, expanse_ipc_handle* second) {
    int sv[2];
    if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) != 0) return -1;
    std::vector<char> bytes(n, 0x5c);
    std::memcpy(bytes.data(), &r, std::min(n, sizeof r));
    for (int round = 0; round < (twice ? 2 : 1) && !hang_up; ++round) {
      iovec iov{bytes.data(), bytes.size()};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
      std::memset(control, 0, sizeof control);
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (!fds.empty()) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
      }
      if (sendmsg(sv[1], &msg, MSG_NOSIGNAL) < 0) fail("sendmsg failed");
    }
    close(sv[1]);  // the peer is gone once its messages are sent
    const int rc = expanse_ipc_recv(sv[0], out);
    if (twice && rc == EXPANSE_OK && expanse_ipc_recv(sv[0], second) != EXPANSE_OK) {
      fail(std::string("the second of two messages: ") + expanse_last_error());
    }
    close(sv[0]);
    return rc;
  }

  void trial(Choices& c) {
    ++trials_;
    kind_.clear();
    const Genuine& g = genuine_[c.pick(genuine_.size())];
    RecordBytes r;
    std::memcpy(&r, &g.handle, sizeof r);
    // The record's own fd, so that releasing it leaves the genuine handle open.
    std::vector<int> owned{fcntl(r.fds[0], F_DUPFD_CLOEXEC, 0)};
    r.fds[0] = owned[0];
    int device = 0;
    Expect e;
    const uint64_t page = uint64_t{2} << 20;
    const uint64_t kLies[] = {0, 1, page - 1, page, 3 * page, uint64_t{1} << 40, UINT64_MAX,
                              UINT64_MAX - page + 1};
    auto lie = [&] { return c.pick(2) == 0 ? kLies[c.pick(8)] : c.pick(uint64_t{64} << 20); };
    const uint64_t kind = c.pick(16);
    switch (kind) {
      case 0:
        kind_ = "the record as exported";
        break;
      case 1: {
        const uint32_t i = static_cast<uint32_t>(c.pick(4));
        const uint64_t v = lie();
        kind_ = "handle_bytes[" + std::to_string(i) + "] = " + std::to_string(v);
        e.may_pass = i >= r.num_handles || v == r.handle_bytes[i];
        r.handle_bytes[i] = v;
        e.names = {"handle_bytes", "offset", "size"};  // offset and size are checked against it
        break;
      }
      case 2: {
        const uint64_t v = lie();
        kind_ = "size = " + std::to_string(v);
        e.may_pass = v != 0 && v <= r.handle_bytes[0] - r.offset;
        e.same_bytes = true;
        r.size = v;
        e.names = {"size"};
        break;
      }
      case 3: {
        const uint64_t v = c.pick(2) == 0 ? r.handle_bytes[0] : lie();
        kind_ = "offset = " + std::to_string(v);
        e.may_pass = v < r.handle_bytes[0] && r.size <= r.handle_bytes[0] - v;
        e.same_bytes = v == r.offset;
        r.offset = v;
        e.names = {"offset", "size"};
        break;
      }
      case 4: {
        const uint32_t v = static_cast<uint32_t>(c.pick(2) == 0 ? c.pick(6) : UINT32_MAX);
        kind_ = "num_handles = " + std::to_string(v);
        e.may_pass = v == r.num_handles;
        r.num_handles = v;
        e.names = {"num_handles", "handle_bytes", "fd"};
        break;
      }
      case 5: {
        switch (c.pick(4)) {
          case 0: r.magic ^= 1u << c.pick(32); kind_ = "magic"; e.names = {"not an expanse_ipc_handle"}; break;
          case 1: r.version = static_cast<uint16_t>(r.version + 1 + c.pick(100)); kind_ = "version"; e.names = {"version"}; break;
          case 2: r.handle_type = static_cast<uint16_t>(c.pick(8)); kind_ = "handle_type"; e.names = {"handle_type"}; e.may_pass = r.handle_type == 1; break;
          default: r.state = static_cast<uint32_t>(c.pick(2) == 0 ? 0 : 2 + c.pick(100)); kind_ = "state"; e.names = {"state", "released"}; break;
        }
        break;
      }
      case 6: {
        kind_ = "fds[0]";
        const int fd = wrong_fd(c);
        if (fd >= 0 && kind_.find("closed") == std::string::npos) owned.push_back(fd);
        r.fds[0] = fd;
        e.names = {"fd"};
        // Another block's handle of the same size is a valid capability to that block; the sim
        // takes a memfd named as its handles for one (a GPU's driver would refuse it).
        e.may_pass = kind_.find("another block") != std::string::npos ||
                     kind_.find("named as a handle") != std::string::npos;
        e.same_bytes = false;
        break;
      }
      case 7: {
        device = c.pick(2) == 0 ? 1 : (c.pick(2) == 0 ? -1 : 7);
        kind_ = "device " + std::to_string(device);
        e.names = {"device"};
        break;
      }
      case 8: {
        // Random bytes over a random stretch of the record, fds excepted (they are this
        // process's numbers, not the peer's: the socket trials lie about those).
        const size_t from = c.pick(offsetof(RecordBytes, fds));
        const size_t len = 1 + c.pick(offsetof(RecordBytes, fds) - from);
        unsigned char* b = reinterpret_cast<unsigned char*>(&r);
        for (size_t i = 0; i < len; ++i) b[from + i] = static_cast<unsigned char>(c.pick(256));
        kind_ = "random bytes " + std::to_string(from) + "+" + std::to_string(len);
        e.names = {"handle_bytes", "offset", "size", "num_handles", "not an expanse_ipc_handle",
                   "version", "handle_type", "state", "released", "fd", "device"};
        e.may_pass = true;
        e.same_bytes = false;
        break;
      }
      default:
        socket_trial(c, r, owned, g);
        for (int fd : owned) close(fd);
        after_trial();
        return;
    }
    expanse_ipc_handle h;
    std::memcpy(&h, &r, sizeof h);
    import_and_check(h, device, e, g);
    for (int fd : owned) close(fd);
    after_trial();
  }

  void socket_trial(Choices& c, const RecordBytes& r, const std::vector<int>& owned,
                    const Genuine& g) {
    Expect e;
    size_t n = sizeof r;
    std::vector<int> fds{owned[0]};
    bool twice = false, hang_up = false;
    const int type = c.pick(2) == 0 ? SOCK_STREAM : SOCK_SEQPACKET;
    kind_ = type == SOCK_STREAM ? "stream: " : "seqpacket: ";
    switch (c.pick(7)) {
      case 0: kind_ += "as exported"; break;
      case 1:
        n = 1 + c.pick(sizeof r - 1);
        kind_ += "truncated to " + std::to_string(n);
        e.names = {"bytes", "closed"};  // a stream's recv waits for all, then finds the end
        break;
      case 2:
        n = sizeof r + 1 + c.pick(64);
        kind_ += "oversized to " + std::to_string(n);
        // A stream carries the rest to the next message: this one reads as the record.
        if (type == SOCK_SEQPACKET) e.names = {"bytes"};
        break;
      case 3: twice = true; kind_ += "sent twice"; break;
      case 4:
        fds.push_back(owned[0]);
        kind_ += "two fds for one handle";
        e.names = {"fds"};
        break;
      case 5:
        fds.clear();
        kind_ += "no fds";
        e.names = {"fds"};
        break;
      default:
        hang_up = true;
        kind_ += "peer hung up";
        e.names = {"closed"};
        break;
    }
    expanse_ipc_handle got{}, second{};
    const int rc = through_socket(r, n, fds, type, twice, hang_up, &got, &second);
    if (e.names.empty()) {
      if (rc != EXPANSE_OK) {
        fail(std::string("expanse_ipc_recv refused: ") + expanse_last_error());
      } else {
        import_and_check(got, 0, Expect{}, g);
        if (twice) import_and_check(second, 0, Expect{}, g);
      }
    } else if (rc == EXPANSE_OK) {
      fail("expanse_ipc_recv accepted it");
    } else {
      named(rc, e);
    }
    expanse_ipc_handle_release(&got);
    expanse_ipc_handle_release(&second);
  }

  void named(int rc, const Expect& e) {
    ++refused_;
    const std::string m = expanse_last_error();
    if (rc != EXPANSE_EINVAL) fail("answered " + std::to_string(rc) + ", not EINVAL: " + m);
    for (const char* n : e.names) {
      if (m.find(n) != std::string::npos) return;
    }
    std::string want;
    for (const char* n : e.names) want += std::string(want.empty() ? "" : " or ") + n;
    fail("the message does not name " + want + ": " + m);
  }

  void import_and_check(const expanse_ipc_handle& h, int device, const Expect& e,
                        const Genuine& g) {
    void* q = nullptr;
    const int rc = expanse_ipc_import(&h, device, &q);
    if (rc != EXPANSE_OK) {
      if (q != nullptr) fail("a refused import gave a pointer");
      if (e.names.empty()) {
        fail(std::string("refused: ") + expanse_last_error());
      } else {
        named(rc, e);
      }
      return;
    }
    ++imported_;
    if (!e.names.empty() && !e.may_pass) fail("imported: the lie was not caught");
    const RecordBytes* r = reinterpret_cast<const RecordBytes*>(&h);
    // Every byte it claims is mapped: the first and the last are read (a fault is a finding).
    volatile const char* v = static_cast<const char*>(q);
    (void)v[0];
    (void)v[r->size - 1];
    if (e.same_bytes && r->size >= 8) {
      uint64_t w = 0;
      std::memcpy(&w, q, 8);
      if (w != word(g.seed, 0)) fail("imported, but not the exported block's bytes");
    }
    if (expanse_ipc_close(q) != EXPANSE_OK) fail(std::string("close: ") + expanse_last_error());
  }

  void after_trial() {
    const size_t now = open_fds();
    if (now != fds_before_) {
      fail(std::to_string(now) + " fds open, " + std::to_string(fds_before_) + " before");
      fds_before_ = now;
    }
  }

  expanse_pool_id pool_ = 0;
  std::vector<Genuine> genuine_;
  std::vector<std::string> failures_;
  std::string kind_;
  size_t fds_before_ = 0;
  size_t trials_ = 0;
  size_t imported_ = 0;
  size_t refused_ = 0;
};

}  // namespace expanse::test::fuzz
