#include "isolation.hpp"

#include "conformance.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <type_traits>

extern char** environ;

namespace expanse::conformance {
namespace {

constexpr const char* kJournalVar = "EXPANSE_CONFORMANCE_JOURNAL";

const char* journal_path() {
  const char* p = std::getenv(kJournalVar);
  return p != nullptr && *p != '\0' ? p : nullptr;
}

int journal_fd() {
  static const int fd = [] {
    const char* p = journal_path();
    return p == nullptr ? -1 : ::open(p, O_WRONLY | O_APPEND | O_CLOEXEC);
  }();
  return fd;
}

// One line, one write(2): whatever the child has journaled is in the file when it dies.
void journal_line(std::string line) {
  const int fd = journal_fd();
  if (fd < 0) return;
  line += '\n';
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Journal fields are one line each: newlines, tabs and backslashes are escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string thread_tag() {
  return std::to_string(static_cast<unsigned long>(pthread_self()) & 0xffffffUL);
}

template <typename T>
void append_arg(std::string& s, T v) {
  if (s.back() != '(') s += ", ";
  char buf[24];
  if constexpr (std::is_pointer_v<T>) {
    std::snprintf(buf, sizeof buf, "0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(v)));
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  } else {
    std::snprintf(buf, sizeof buf, "{...}");  // a struct passed by value
  }
  s += buf;
}

template <int I, typename F>
struct Journaled;

template <int I, typename... A>
struct Journaled<I, CUresult(CUDAAPI*)(A...)> {
  static inline CUresult(CUDAAPI* real)(A...) = nullptr;
  static CUresult CUDAAPI call(A... a) {
    const std::string tag = thread_tag();
    std::string text = driver::entry_point_name(static_cast<driver::EntryPoint>(I));
    text += '(';
    (append_arg(text, a), ...);
    text += ')';
    journal_line("CALL " + tag + " " + text);
    const CUresult r = real(a...);
    journal_line("RET " + tag + " " + std::to_string(static_cast<int>(r)));
    return r;
  }
};

// The child's side of the journal: the case's start and end, its failures and its skip.
class JournalListener final : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    journal_line(std::string("BEGIN ") + info.test_suite_name() + "." + info.name());
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      journal_line("FAIL " + escape(r.file_name() != nullptr ? r.file_name() : "") + "\t" +
                   std::to_string(r.line_number()) + "\t" + escape(r.message()));
    } else if (r.skipped()) {
      journal_line("SKIP " + escape(r.message()));
    }
  }
  void OnTestEnd(const ::testing::TestInfo&) override { journal_line("END"); }
};

// Registered before main (gtest_main builds this binary): only in a child. A child's crash is
// reported by its parent; it leaves no core file (a GPU process's core can be gigabytes).
[[maybe_unused]] const bool g_child_setup = [] {
  if (journal_fd() < 0) return false;
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  ::testing::UnitTest::GetInstance()->listeners().Append(new JournalListener);
  return true;
}();

// A file in TMPDIR (or /tmp), removed with the object.
class TempFile {
 public:
  explicit TempFile(const char* what) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/expanse-conformance-" +
            what + "-XXXXXX";
    fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
    if (fd_ < 0) error_ = "mkostemp " + path_ + ": " + std::strerror(errno);
  }
  ~TempFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }
  std::string read_all() const {
    std::string out;
    char buf[8192];
    off_t at = 0;
    for (;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      at += n;
    }
    return out;
  }

 private:
  std::string path_;
  std::string error_;
  int fd_ = -1;
};

void parse_journal(const std::string& text, IsolatedRun* run, bool* begun) {
  std::string last_call_tag;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    const std::string kind = line.substr(0, sp);
    const std::string rest = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (kind == "BEGIN") {
      *begun = true;
    } else if (kind == "CALL") {
      const size_t t = rest.find(' ');
      last_call_tag = rest.substr(0, t);
      run->last_call = t == std::string::npos ? "" : rest.substr(t + 1);
      run->last_call_returned = false;
    } else if (kind == "RET") {
      // Only the last call's own thread returns it: another thread's answer is not its.
      const size_t t = rest.find(' ');
      if (rest.substr(0, t) == last_call_tag && t != std::string::npos) {
        run->last_call_returned = true;
        run->last_code = std::atoi(rest.c_str() + t + 1);
      }
    } else if (kind == "STEP") {
      run->last_step = unescape(rest);
    } else if (kind == "FAIL") {
      const size_t a = rest.find('\t');
      const size_t b = a == std::string::npos ? a : rest.find('\t', a + 1);
      ChildFailure f;
      if (b == std::string::npos) {
        f.message = unescape(rest);
      } else {
        f.file = unescape(rest.substr(0, a));
        f.line = std::atoi(rest.substr(a + 1, b - a - 1).c_str());
        f.message = unescape(rest.substr(b + 1));
      }
      run->failures.push_back(std::move(f));
    } else if (kind == "SKIP") {
      run->skip_message = unescape(rest);
    } else if (kind == "END") {
      run->case_ended = true;
    }
  }
}

}  // namespace

bool in_isolated_child() { return journal_path() != nullptr; }

const driver::DriverTable& journaled(const driver::DriverTable& real) {
  if (!in_isolated_child()) return real;
  // One child runs one case on one driver: one journaled table per process.
  static driver::DriverTable out;
  static const driver::DriverTable* from = nullptr;
  if (from != &real) {
    out = real;
#define EXPANSE_X(field, base, symbol, ...)                                                 \
  if (real.field != nullptr) {                                                              \
    using J = Journaled<static_cast<int>(driver::EntryPoint::field), decltype(&::symbol)>;  \
    J::real = real.field;                                                                   \
    out.field = &J::call;                                                                   \
  }
    EXPANSE_DRIVER_ENTRY_POINTS(EXPANSE_X)
#undef EXPANSE_X
    from = &real;
  }
  return out;
}

void journal_step(const std::string& what) {
  if (in_isolated_child()) journal_line("STEP " + escape(what));
}

std::string current_test_full_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}

IsolatedRun run_isolated(const std::string& full_name, int timeout_s) {
  IsolatedRun run;
  run.timeout_s = timeout_s;
  char exe[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    run.error = std::string("readlink /proc/self/exe: ") + std::strerror(errno);
    return run;
  }
  exe[len] = '\0';
  const TempFile journal("journal");
  const TempFile output("output");
  if (journal.fd() < 0 || output.fd() < 0) {
    run.error = journal.fd() < 0 ? journal.error() : output.error();
    return run;
  }

  // Everything the child gets is built before it starts: after the spawn, only waiting.
  std::vector<std::string> args = {exe, "--gtest_filter=" + full_name, "--gtest_color=no"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    // No sharding (the child would skip its case), no output file shared with the parent.
    if (std::strncmp(*e, "GTEST_", 6) == 0) continue;
    if (std::strncmp(*e, kJournalVar, std::strlen(kJournalVar)) == 0) continue;
    env.emplace_back(*e);
  }
  env.push_back(std::string(kJournalVar) + "=" + journal.path());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, output.fd(), 1);
  posix_spawn_file_actions_adddup2(&actions, output.fd(), 2);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, exe, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    run.error = std::string("posix_spawn ") + exe + ": " + std::strerror(spawned);
    return run;
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      run.error = std::string("waitpid: ") + std::strerror(errno);
      return run;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);

  bool begun = false;
  parse_journal(journal.read_all(), &run, &begun);
  const std::string out = output.read_all();
  constexpr size_t kTail = 4000;
  run.output_tail = out.size() > kTail ? "..." + out.substr(out.size() - kTail) : out;

  if (timed_out) {
    run.end = IsolatedRun::End::timed_out;
  } else if (!begun) {
    run.end = IsolatedRun::End::not_run;
    run.error = "the child ran no case named " + full_name;
  } else if (run.signal != 0 || !run.case_ended) {
    run.end = IsolatedRun::End::died;
  } else if (!run.failures.empty()) {
    run.end = IsolatedRun::End::failed;
  } else if (run.exit_code != 0) {
    run.end = IsolatedRun::End::died;  // e.g. a sanitizer's report at exit
  } else if (!run.skip_message.empty()) {
    run.end = IsolatedRun::End::skipped;
  } else {
    run.end = IsolatedRun::End::passed;
  }
  return run;
}

std::string death_report(const IsolatedRun& run, const std::string& full_name) {
  std::ostringstream m;
  m << full_name;
  switch (run.end) {
    case IsolatedRun::End::timed_out:
      m << " did not end within " << run.timeout_s
        << " s in its isolated child process, which was killed";
      break;
    case IsolatedRun::End::not_run:
      m << " did not run in an isolated child process: " << run.error;
      if (run.exit_code >= 0) m << " (the child exited with code " << run.exit_code << ")";
      break;
    default:
      m << " died in its isolated child process: ";
      if (run.signal != 0) {
        const char* name = strsignal(run.signal);
        m << "killed by signal " << run.signal << " (" << (name != nullptr ? name : "?") << ")";
      } else if (!run.case_ended) {
        m << "it exited with code " << run.exit_code << " before the case ended";
      } else {
        m << "it exited with code " << run.exit_code << " after the case ended without failures";
      }
      if (run.case_ended && run.signal != 0) m << " after the case ended";
      break;
  }
  if (run.end != IsolatedRun::End::not_run) {
    if (run.last_call.empty()) {
      m << "\n  before any driver call of the case";
    } else if (!run.last_call_returned) {
      m << "\n  inside the driver call " << run.last_call << ", which had not returned";
    } else {
      m << "\n  after its last driver call " << run.last_call << " returned "
        << result_name(static_cast<CUresult>(run.last_code));
    }
    if (!run.last_step.empty()) m << "\n  in the step: " << run.last_step;
  }
  if (!run.failures.empty()) {
    m << "\n  failures it reported before that:";
    for (const ChildFailure& f : run.failures) {
      m << "\n    " << (f.file.empty() ? "?" : f.file) << ":" << f.line << ": " << f.message;
    }
  }
  if (!run.output_tail.empty()) m << "\n  the child's output ends with:\n" << run.output_tail;
  return m.str();
}

void report_isolated(const IsolatedRun& run, const std::string& full_name) {
  switch (run.end) {
    case IsolatedRun::End::passed:
      return;
    case IsolatedRun::End::skipped:
      GTEST_SKIP() << "[isolated child] " << run.skip_message;
    case IsolatedRun::End::failed:
      for (const ChildFailure& f : run.failures) {
        if (f.file.empty()) {
          ADD_FAILURE() << "[isolated child] " << f.message;
        } else {
          ADD_FAILURE_AT(f.file.c_str(), f.line) << "[isolated child] " << f.message;
        }
      }
      return;
    case IsolatedRun::End::died:
    case IsolatedRun::End::timed_out:
    case IsolatedRun::End::not_run: {
      // At the case's own definition: the failure is the case's, wherever in it the child died.
      const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
      if (info != nullptr && info->file() != nullptr) {
        ADD_FAILURE_AT(info->file(), info->line()) << death_report(run, full_name);
      } else {
        ADD_FAILURE() << death_report(run, full_name);
      }
      return;
    }
  }
}

}  // namespace expanse::conformance
