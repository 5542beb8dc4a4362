// expanse_ipc_*: sharing a registrable block with other processes (expanse.h, "Sharing across
// processes"; ipc_wire.hpp for the record and the socket).
#include "api/errors.hpp"
#include "api/ipc_wire.hpp"
#include "api/runtime.hpp"
#include "core/base/format.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace expanse::api {
namespace {

std::string errno_text(int e) { return std::string(std::strerror(e)); }

void close_all(const int* fds, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (fds[i] >= 0) ::close(fds[i]);
  }
}

}  // namespace

void ipc_check(const IpcWire& h, const char* what) {
  const std::string at = std::string("expanse: ") + what + ": ";
  if (h.magic != IpcWire::kMagic) {
    throw usage_error(at + "not an expanse_ipc_handle (never filled by expanse_ipc_export or "
                           "expanse_ipc_recv: its magic is wrong); nothing was changed");
  }
  if (h.version != IpcWire::kVersion) {
    throw usage_error(at + "an expanse_ipc_handle of version " + std::to_string(h.version) +
                      ", but this expanse reads version " + std::to_string(IpcWire::kVersion) +
                      " (exporter and importer must run the same expanse); nothing was changed");
  }
  if (h.state == IpcWire::kReleased) {
    throw usage_error(at + "the handle was released (expanse_ipc_handle_release closed its fds); "
                           "nothing was changed");
  }
  // A record from another process may say anything: each field is named where it fails.
  if (h.state != IpcWire::kFilled) {
    throw usage_error(at + "a damaged expanse_ipc_handle: state is " + std::to_string(h.state) +
                      ", neither filled nor released; nothing was changed");
  }
  if (h.num_handles == 0 || h.num_handles > IpcWire::kMaxHandles) {
    throw usage_error(at + "a damaged expanse_ipc_handle: num_handles is " +
                      std::to_string(h.num_handles) + ", not 1 to " +
                      std::to_string(IpcWire::kMaxHandles) + "; nothing was changed");
  }
  if (h.handle_type != IpcWire::kPosixFd) {
    throw usage_error(at + "a damaged expanse_ipc_handle: handle_type is " +
                      std::to_string(h.handle_type) + ", not " +
                      std::to_string(IpcWire::kPosixFd) + " (POSIX fds); nothing was changed");
  }
  for (uint32_t i = 0; i < h.num_handles; ++i) {
    if (h.fds[i] < 0 || fcntl(h.fds[i], F_GETFD) < 0) {
      throw usage_error(at + "fd " + std::to_string(h.fds[i]) + " of the handle (block of " +
                        std::to_string(h.size) + " bytes from process " +
                        std::to_string(h.exporter_pid) +
                        ") is not open in this process; nothing was changed");
    }
  }
}

void ipc_check_extent(const IpcWire& h, const char* what) {
  const std::string at = std::string("expanse: ") + what + ": a damaged expanse_ipc_handle: ";
  uint64_t extent = 0;
  for (uint32_t i = 0; i < h.num_handles; ++i) {
    if (h.handle_bytes[i] == 0 || h.handle_bytes[i] > UINT64_MAX - extent) {
      throw usage_error(at + "handle_bytes[" + std::to_string(i) + "] is " +
                        std::to_string(h.handle_bytes[i]) + "; nothing was changed");
    }
    extent += h.handle_bytes[i];
  }
  if (h.offset >= h.handle_bytes[0]) {
    throw usage_error(at + "offset " + std::to_string(h.offset) +
                      " is not inside the first handle (handle_bytes[0] = " +
                      std::to_string(h.handle_bytes[0]) + "); nothing was changed");
  }
  if (h.size == 0 || h.size > extent - h.offset) {
    throw usage_error(at + "size " + std::to_string(h.size) + " does not fit the " +
                      std::to_string(extent - h.offset) + " bytes of its handles after offset " +
                      std::to_string(h.offset) + "; nothing was changed");
  }
}

void ipc_send(int sock, const IpcWire& h) {
  ipc_check(h, "expanse_ipc_send");
  IpcWire copy = h;
  for (int& fd : copy.fds) fd = -1;  // fd numbers mean nothing in the receiver
  iovec iov{&copy, sizeof copy};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * IpcWire::kMaxHandles)];
  std::memset(control, 0, sizeof control);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * h.num_handles);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * h.num_handles);
  std::memcpy(CMSG_DATA(c), h.fds, sizeof(int) * h.num_handles);
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    throw usage_error("expanse: expanse_ipc_send on socket " + std::to_string(sock) + ": " +
                      errno_text(errno) + "; nothing was sent");
  }
  if (static_cast<size_t>(n) != sizeof copy) {
    throw usage_error("expanse: expanse_ipc_send on socket " + std::to_string(sock) +
                      ": sent " + std::to_string(n) + " of " + std::to_string(sizeof copy) +
                      " bytes (use a SOCK_STREAM or SOCK_SEQPACKET Unix-domain socket)");
  }
}

void ipc_recv(int sock, IpcWire* out) {
  IpcWire got{};
  iovec iov{&got, sizeof got};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * IpcWire::kMaxHandles)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (n < 0 && errno == EINTR);
  const std::string at = "expanse: expanse_ipc_recv on socket " + std::to_string(sock) + ": ";
  if (n < 0) throw usage_error(at + errno_text(errno));
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  auto fail = [&](const std::string& why) {
    close_all(fds.data(), fds.size());
    throw usage_error(at + why);
  };
  if (n == 0) fail("the peer closed the socket");
  if (static_cast<size_t>(n) != sizeof got) {
    fail("a message of " + std::to_string(n) + " bytes, not an expanse_ipc_handle");
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    fail("a message longer than the " + std::to_string(sizeof got) +
         " bytes of an expanse_ipc_handle (its rest was cut off)");
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) fail("file descriptors were cut off (MSG_CTRUNC)");
  if (got.magic != IpcWire::kMagic) fail("the message is not an expanse_ipc_handle (its magic)");
  if (got.version != IpcWire::kVersion) {
    fail("an expanse_ipc_handle of version " + std::to_string(got.version) +
         ", but this expanse reads version " + std::to_string(IpcWire::kVersion));
  }
  if (got.num_handles == 0 || got.num_handles > IpcWire::kMaxHandles) {
    fail("the message's num_handles is " + std::to_string(got.num_handles) + ", not 1 to " +
         std::to_string(IpcWire::kMaxHandles));
  }
  if (fds.size() != got.num_handles) {
    fail("the handle names " + std::to_string(got.num_handles) + " fds but " +
         std::to_string(fds.size()) + " came with it");
  }
  for (uint32_t i = 0; i < IpcWire::kMaxHandles; ++i) got.fds[i] = i < fds.size() ? fds[i] : -1;
  got.state = IpcWire::kFilled;
  *out = got;
}

}  // namespace expanse::api

using expanse::api::guarded;
using expanse::api::IpcWire;

namespace {

IpcWire* wire(expanse_ipc_handle* h) { return reinterpret_cast<IpcWire*>(h); }
const IpcWire* wire(const expanse_ipc_handle* h) { return reinterpret_cast<const IpcWire*>(h); }

int null_arg(const char* what) {
  expanse::api::last_error() = std::string("expanse: ") + what + ": NULL argument";
  return EXPANSE_EINVAL;
}

}  // namespace

extern "C" {

EXPANSE_C_API int expanse_ipc_export(void* ptr, expanse_ipc_handle* out) {
  if (out == nullptr) return null_arg("expanse_ipc_export");
  return guarded([&] {
    auto& rt = expanse::api::Runtime::get();
    for (int d = 0; d < rt.device_count(); ++d) {
      expanse::core::DeviceAllocator* a = rt.existing(d);
      if (a == nullptr) continue;
      if (!a->is_registrable(ptr) && !a->owns(ptr)) continue;
      const expanse::core::DeviceAllocator::Export e = a->export_block(ptr);
      IpcWire w{};
      w.magic = IpcWire::kMagic;
      w.version = IpcWire::kVersion;
      w.handle_type = IpcWire::kPosixFd;
      w.device = d;
      w.num_handles = 1;
      w.size = e.requested;
      w.offset = 0;
      w.exporter_pid = static_cast<uint64_t>(getpid());
      w.exporter_address = reinterpret_cast<uint64_t>(ptr);
      w.handle_bytes[0] = e.extent;
      for (int& fd : w.fds) fd = -1;
      w.fds[0] = e.fd;
      w.state = IpcWire::kFilled;
      std::memcpy(out, &w, sizeof w);
      return;
    }
    throw expanse::usage_error("expanse: ipc export of " + expanse::core::hex(
                                   reinterpret_cast<CUdeviceptr>(ptr)) +
                               ": not a live block on any device; nothing was changed");
  });
}

EXPANSE_C_API int expanse_ipc_send(int unix_socket, const expanse_ipc_handle* h) {
  if (h == nullptr) return null_arg("expanse_ipc_send");
  return guarded([&] { expanse::api::ipc_send(unix_socket, *wire(h)); });
}

EXPANSE_C_API int expanse_ipc_recv(int unix_socket, expanse_ipc_handle* out) {
  if (out == nullptr) return null_arg("expanse_ipc_recv");
  return guarded([&] { expanse::api::ipc_recv(unix_socket, wire(out)); });
}

EXPANSE_C_API int expanse_ipc_import(const expanse_ipc_handle* h, int device, void** ptr) {
  if (h == nullptr || ptr == nullptr) return null_arg("expanse_ipc_import");
  *ptr = nullptr;
  return guarded([&] {
    const IpcWire& w = *wire(h);
    expanse::api::ipc_check(w, "expanse_ipc_import");
    expanse::api::ipc_check_extent(w, "expanse_ipc_import");
    std::vector<int> fds(w.fds, w.fds + w.num_handles);
    std::vector<size_t> sizes(w.handle_bytes, w.handle_bytes + w.num_handles);
    *ptr = expanse::api::Runtime::get().device(device).import_block(fds, sizes,
                                                                     static_cast<size_t>(w.offset));
  });
}

EXPANSE_C_API int expanse_ipc_close(void* ptr) {
  return guarded([&] {
    auto& rt = expanse::api::Runtime::get();
    for (int d = 0; d < rt.device_count(); ++d) {
      expanse::core::DeviceAllocator* a = rt.existing(d);
      if (a != nullptr && a->is_import(ptr)) return a->close_import(ptr);
    }
    throw expanse::usage_error("expanse: ipc close of " + expanse::core::hex(
                                   reinterpret_cast<CUdeviceptr>(ptr)) +
                               ": not an address expanse_ipc_import returned (or closed "
                               "already); nothing was changed");
  });
}

EXPANSE_C_API int expanse_ipc_handle_release(expanse_ipc_handle* h) {
  if (h == nullptr) return null_arg("expanse_ipc_handle_release");
  IpcWire* w = wire(h);
  if (w->magic != IpcWire::kMagic || w->state == IpcWire::kReleased) return EXPANSE_OK;
  for (int& fd : w->fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  w->state = IpcWire::kReleased;
  return EXPANSE_OK;
}

EXPANSE_C_API size_t expanse_ipc_handle_size(const expanse_ipc_handle* h) {
  if (h == nullptr) return 0;
  const IpcWire* w = wire(h);
  return w->magic == IpcWire::kMagic && w->state == IpcWire::kFilled ? w->size : 0;
}

}  // extern "C"
