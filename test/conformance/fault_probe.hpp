// Does touching a host address fault? (sigsetjmp around one volatile access.)
//
// The sim backs device memory with host pages: reserved VA is PROT_NONE, a mapping becomes
// readable/writable only after cuMemSetAccess, and unmapped pages fault again. These probes
// observe that without crashing the test. Single-threaded use only (they swap the process's
// SIGSEGV/SIGBUS handlers for the duration of the access).
#pragma once

namespace expanse::conformance {

// Reading one byte at p does not fault.
bool probe_readable(const void* p);
// Reading one byte at p and writing the same value back does not fault.
bool probe_writable(void* p);

}  // namespace expanse::conformance
