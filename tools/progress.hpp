// A progress bar on stderr, for work that takes more than a second, when stderr is a terminal.
#pragma once

#include <chrono>
#include <string>

namespace expanse::tools {

class ProgressBar {
 public:
  // enabled: draw at all (the CLI passes isatty(stderr)).
  explicit ProgressBar(bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // fraction in [0, 1]; label says what is running. Draws at most 10 times a second, and only
  // once a second has passed since the bar was made.
  void update(double fraction, const std::string& label);
  // Erases the bar (if drawn), so that what follows starts on a clean line.
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

// True when stderr is a terminal.
bool stderr_is_terminal();

}  // namespace expanse::tools
