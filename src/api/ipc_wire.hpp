// What an expanse_ipc_handle holds (expanse.h: opaque, EXPANSE_IPC_HANDLE_SIZE bytes), and how it
// travels over a Unix-domain socket: the record's bytes as the message, its fds as SCM_RIGHTS.
#pragma once

#include "expanse/expanse.h"

#include <cstdint>
#include <string>

namespace expanse::api {

struct IpcWire {
  static constexpr uint32_t kMagic = 0x49505845;  // "EXPI"
  static constexpr uint16_t kVersion = 1;
  static constexpr uint32_t kMaxHandles = 4;
  static constexpr uint16_t kPosixFd = 1;  // the handle type of every fd (fabric: none yet)
  static constexpr uint32_t kFilled = 1;
  static constexpr uint32_t kReleased = 2;

  uint32_t magic;
  uint16_t version;
  uint16_t handle_type;
  int32_t device;         // the exporter's device ordinal (for messages)
  uint32_t num_handles;   // 1..kMaxHandles
  uint64_t size;          // the block's bytes as asked for
  uint64_t offset;        // the block's offset into its first handle
  uint64_t exporter_pid;  // for messages
  uint64_t exporter_address;
  uint64_t handle_bytes[kMaxHandles];
  int32_t fds[kMaxHandles];  // the holding process's fds; -1 where none
  uint32_t state;            // kFilled or kReleased
  uint32_t reserved[7];
};
static_assert(sizeof(IpcWire) == EXPANSE_IPC_HANDLE_SIZE, "expanse_ipc_handle layout");
static_assert(sizeof(IpcWire) == sizeof(expanse_ipc_handle), "expanse_ipc_handle layout");

// Sends h (its bytes, and its fds by SCM_RIGHTS) as one message; throws usage_error with errno's
// text.
void ipc_send(int sock, const IpcWire& h);
// Receives one message into *out, its fds in out->fds; throws usage_error on a socket error, a
// short or foreign message (any fds received are closed then).
void ipc_recv(int sock, IpcWire* out);
// Throws usage_error naming `what` unless h is a filled, unreleased handle whose fds are open.
void ipc_check(const IpcWire& h, const char* what);
// Throws usage_error naming the field unless h's sizes are coherent: every handle_bytes nonzero,
// offset inside the first handle, 0 < size <= the handles' bytes after offset.
void ipc_check_extent(const IpcWire& h, const char* what);

}  // namespace expanse::api
