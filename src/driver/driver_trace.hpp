// EXPANSE_DRIVER_TRACE: a driver table whose every entry point reports its calls on stderr.
//
// For a real GPU, where no counter or failure injection shows which call the driver refused
// (a capture invalidated, a context error, a crash inside libcuda): the trace names the entry
// point, the calling thread, its first argument (a stream, a pointer, a handle) and the code.
//   EXPANSE_DRIVER_TRACE=errors   calls that fail (CUDA_ERROR_NOT_READY is an answer, not a failure)
//   EXPANSE_DRIVER_TRACE=all      every call, written before it is made (a crash names its call)
#pragma once

#include "driver_api/driver_table.hpp"

namespace expanse::driver {

enum class TraceMode { off, errors, all };

// EXPANSE_DRIVER_TRACE's value; off when unset or empty. An unknown value throws driver_error
// naming it (a typo must not silently trace nothing).
TraceMode trace_mode_from_env();

// A table that forwards to real's entry points and reports as mode says. One tracer per
// process: a second call replaces the first's targets.
DriverTable traced_table(const DriverTable& real, TraceMode mode);

}  // namespace expanse::driver
