// tools/dion-data/progress.h — one self-overwriting progress line on stderr.
//
// On a terminal: "\r[#######.......]  47%  <text>" at most 10 times a second. Not a terminal
// (a log file, CI): the text alone, one line every 10 seconds. Disabled: nothing. It draws; it
// does not measure (callers pass their own numbers).
#pragma once

#include <chrono>
#include <string>

namespace dion::cli {

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  // fraction in [0, 1], or < 0 when the total is unknown (no bar).
  void update(double fraction, const std::string& text, bool force = false);
  // Leaves the last line on screen and moves to a new one.
  void finish();

 private:
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  size_t last_width_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace dion::cli
