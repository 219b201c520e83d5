// dion/train/schedule.h — the reference's learning-rate schedule (train.py get_lr): linear
// warmup, constant, linear warmdown to 0, as a factor of each group's base lr.
//
//   warmup   = round(warmup_ratio * N)     (Python round: ties to even)
//   warmdown = round(warmdown_ratio * N)
//   step < warmup             -> (step + 1) / warmup
//   step <= N - warmdown      -> 1
//   otherwise                 -> (N - step) / warmdown
// Step s's optimizer step uses lr_factor(s) (LambdaLR semantics).
#pragma once

#include <cfenv>
#include <cmath>
#include <cstdint>

namespace dion::train {

inline int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }  // FE_TONEAREST

inline double lr_factor(int64_t step, int64_t num_iterations, double warmup_ratio, double warmdown_ratio) {
  const int64_t warmup = python_round(warmup_ratio * double(num_iterations));
  const int64_t warmdown = python_round(warmdown_ratio * double(num_iterations));
  if (step < warmup) return double(step + 1) / double(warmup);
  if (step <= num_iterations - warmdown) return 1.0;
  return double(num_iterations - step) / double(warmdown);
}

}  // namespace dion::train
