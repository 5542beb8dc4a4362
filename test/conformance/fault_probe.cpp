#include "fault_probe.hpp"

#include <csetjmp>
#include <csignal>

namespace expanse::conformance {
namespace {

// volatile: the stores around the access must not be moved or dropped by the optimizer.
sigjmp_buf* volatile g_jump = nullptr;

extern "C" void expanse_conformance_on_fault(int /*sig*/) {
  if (g_jump != nullptr) siglongjmp(*g_jump, 1);
}

// Runs access(p) with SIGSEGV/SIGBUS turned into a jump back here; true when it did not fault.
bool runs_without_fault(void (*access)(void*), void* p) {
  struct sigaction on_fault {};
  struct sigaction old_segv {};
  struct sigaction old_bus {};
  on_fault.sa_handler = expanse_conformance_on_fault;
  sigemptyset(&on_fault.sa_mask);
  on_fault.sa_flags = 0;
  sigaction(SIGSEGV, &on_fault, &old_segv);
  sigaction(SIGBUS, &on_fault, &old_bus);
  sigjmp_buf jump;
  volatile bool ok = false;
  if (sigsetjmp(jump, 1) == 0) {
    g_jump = &jump;
    access(p);
    ok = true;
  }
  g_jump = nullptr;
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return ok;
}

void read_byte(void* p) {
  const volatile unsigned char* q = static_cast<const volatile unsigned char*>(p);
  const unsigned char v = *q;
  static_cast<void>(v);
}

void rewrite_byte(void* p) {
  volatile unsigned char* q = static_cast<volatile unsigned char*>(p);
  const unsigned char v = *q;
  *q = v;
}

}  // namespace

bool probe_readable(const void* p) { return runs_without_fault(read_byte, const_cast<void*>(p)); }

bool probe_writable(void* p) { return runs_without_fault(rewrite_byte, p); }

}  // namespace expanse::conformance
