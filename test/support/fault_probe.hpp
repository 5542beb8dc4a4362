// Does touching a host address fault? One volatile access under sigsetjmp, header-only.
//
// The sim backs device memory with host pages: reserved VA is PROT_NONE, a mapping becomes
// readable/writable only after cuMemSetAccess, and unmapped pages fault again. These probes
// observe that without crashing the test. They swap the process's SIGSEGV/SIGBUS handlers for
// the duration of one access, so call them from one thread at a time.
//
//   #include "support/fault_probe.hpp"   (add ${PROJECT_SOURCE_DIR}/test to the include path)
//   EXPECT_FALSE(expanse::test::probe_readable(ptr));
#pragma once

#include <csetjmp>
#include <csignal>

namespace expanse::test {
namespace fault_probe_detail {

inline thread_local sigjmp_buf* t_jump = nullptr;

inline void on_fault(int sig) {
  if (t_jump != nullptr) siglongjmp(*t_jump, 1);
  std::signal(sig, SIG_DFL);  // not ours: die as usual
  std::raise(sig);
}

inline bool touch(volatile unsigned char* p, bool write) {
  struct sigaction action {};
  action.sa_handler = &on_fault;
  sigemptyset(&action.sa_mask);
  struct sigaction old_segv {};
  struct sigaction old_bus {};
  sigaction(SIGSEGV, &action, &old_segv);
  sigaction(SIGBUS, &action, &old_bus);
  sigjmp_buf jump;
  volatile bool ok = false;
  t_jump = &jump;
  if (sigsetjmp(jump, 1) == 0) {
    const unsigned char v = *p;
    if (write) *p = v;
    ok = true;
  }
  t_jump = nullptr;
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return ok;
}

}  // namespace fault_probe_detail

// Reading one byte at p does not fault.
inline bool probe_readable(const void* p) {
  return fault_probe_detail::touch(
      const_cast<volatile unsigned char*>(static_cast<const volatile unsigned char*>(p)), false);
}

// Reading one byte at p and writing the same value back does not fault.
inline bool probe_writable(void* p) {
  return fault_probe_detail::touch(static_cast<volatile unsigned char*>(p), true);
}

}  // namespace expanse::test
