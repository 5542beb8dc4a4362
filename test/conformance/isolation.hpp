// Crash isolation: a rule whose misuse a real driver may answer with a crash (undefined
// behaviour there) runs in a child process, the test binary itself started with a filter that
// names that one case, so that a crash costs the case one failure and the run goes on.
//
// The child writes a journal as it goes (a file the parent names in EXPANSE_CONFORMANCE_JOURNAL):
// each driver call it is about to make and its answer, the steps the case names, each failure
// with its file and line, a skip, the case's start and end. Lines are written with write(2) before
// the call they describe, so a crash leaves them all behind. The parent reads the journal when
// the child has ended: the failures come back at their lines, a skip as a skip, and a death
// (signal, sanitizer exit, exit before the case ended, time-out) as ONE failure naming the last
// driver call the child began and whether it returned.
//
// The child is started with posix_spawn (fork + exec): a process forked after cuInit may not use
// the driver before exec (the sim refuses it too), and exec gives the child a driver of its own.
#pragma once

#include "driver_api/driver_table.hpp"

#include <string>
#include <vector>

namespace expanse::conformance {

// True in a child started by run_isolated.
bool in_isolated_child();

// In a child: a table that forwards to real's entry points, journaling each call (entry point,
// arguments, thread) before it is made and its code after. Elsewhere: real itself.
const driver::DriverTable& journaled(const driver::DriverTable& real);

// In a child: journals the step of the case under way ("export to a NULL output"), which a death
// report names beside the last call. Elsewhere: nothing.
void journal_step(const std::string& what);

// "Drivers/Share.ExportMisuseIsInvalidValue/cuda": the running case, as --gtest_filter takes it.
std::string current_test_full_name();

struct ChildFailure {
  std::string file;  // "" when gtest had no location (an exception)
  int line = -1;
  std::string message;
};

struct IsolatedRun {
  enum class End {
    passed,
    failed,     // ran to its end with failures
    skipped,
    died,       // a signal, an exit before the case ended, or an exit code its failures do not
                // explain (a sanitizer's report at exit)
    timed_out,  // killed after timeout_s
    not_run,    // the child could not start, or ran no case of that name
  };
  End end = End::not_run;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool case_ended = false;
  std::string last_call;  // the last driver call begun: "cuMemCreate(0x7ffd..., 0x200000, ...)"
  bool last_call_returned = false;
  int last_code = 0;      // its answer, when it returned
  std::string last_step;  // the last journal_step
  std::vector<ChildFailure> failures;
  std::string skip_message;
  std::string output_tail;  // the end of what the child wrote on stdout and stderr
  std::string error;        // why it did not run (not_run)
  int timeout_s = 0;
};

// Runs the case full_name alone in a child (this binary, --gtest_filter=full_name, no GTEST_*
// variables inherited: no sharding, no output file) and waits for it, at most timeout_s seconds.
IsolatedRun run_isolated(const std::string& full_name, int timeout_s = 120);

// The current test's outcome from a child's: its failures at their file and line, its skip, or
// for a death, a time-out or a case that did not run, ONE failure saying so (death_report).
void report_isolated(const IsolatedRun& run, const std::string& full_name);

// The message of that one failure: how the child ended, the last driver call it began and
// whether it returned, the last step, the failures it reported first, the end of its output.
std::string death_report(const IsolatedRun& run, const std::string& full_name);

}  // namespace expanse::conformance
