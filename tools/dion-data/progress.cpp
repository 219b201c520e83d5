// tools/dion-data/progress.cpp — see progress.h.
#include "progress.h"

#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace dion::cli {

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1) {}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::update(double fraction, const std::string& text, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(10000);
  if (!force && drawn_ && now - last_ < interval) return;
  last_ = now;
  std::string line;
  if (fraction >= 0) {
    constexpr int kWidth = 24;
    const double f = std::clamp(fraction, 0.0, 1.0);
    const int filled = static_cast<int>(f * kWidth);
    char bar[64];
    std::snprintf(bar, sizeof(bar), "[%.*s%.*s] %3d%%  ", filled, "########################", kWidth - filled,
                  "........................", static_cast<int>(f * 100));
    line = bar;
  }
  line += text;
  if (tty_) {
    const size_t width = line.size();
    if (width < last_width_) line += std::string(last_width_ - width, ' ');
    last_width_ = width;
    std::fprintf(stderr, "\r%s", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::finish() {
  if (enabled_ && drawn_ && tty_) std::fputc('\n', stderr);
  drawn_ = false;
  last_width_ = 0;
}

}  // namespace dion::cli
