// Learning-rate adjustments (see include/dion/math/lr.h).
#include "dion/math/lr.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dion::math {

AdjustLR adjust_lr_from_string(const std::string& name) {
  if (name == "spectral_norm") return AdjustLR::SPECTRAL_NORM;
  if (name == "rms_norm") return AdjustLR::RMS_NORM;
  if (name == "none" || name.empty()) return AdjustLR::NONE;
  throw std::invalid_argument("invalid adjust_lr '" + name +
                              "': valid values are 'spectral_norm', 'rms_norm' and 'none'");
}

std::string to_string(AdjustLR mode) {
  switch (mode) {
    case AdjustLR::SPECTRAL_NORM:
      return "spectral_norm";
    case AdjustLR::RMS_NORM:
      return "rms_norm";
    case AdjustLR::NONE:
      return "none";
  }
  return "none";
}

namespace {
void fans(c10::IntArrayRef shape, bool flatten, double& fan_out, double& fan_in) {
  const size_t n = shape.size();
  if (flatten) {
    fan_out = static_cast<double>(shape[0]);
    fan_in = 1;
    for (size_t i = 1; i < n; ++i) fan_in *= static_cast<double>(shape[i]);
  } else {
    fan_out = static_cast<double>(shape[n - 2]);
    fan_in = static_cast<double>(shape[n - 1]);
  }
}
}  // namespace

double adjust_factor(AdjustLR mode, c10::IntArrayRef shape, bool flatten) {
  if (mode == AdjustLR::NONE) return 1.0;
  double fan_out = 0, fan_in = 0;
  fans(shape, flatten, fan_out, fan_in);
  if (mode == AdjustLR::SPECTRAL_NORM) return std::sqrt(fan_out / fan_in);
  return 0.2 * std::sqrt(std::max(fan_out, fan_in));
}

float adjusted_lr(float lr, AdjustLR mode, c10::IntArrayRef shape, bool flatten) {
  if (mode == AdjustLR::NONE) return lr;
  // The reference multiplies a float32 0-d tensor by a Python float: the factor is rounded
  // to float32 first, then one float32 multiply.
  return lr * adjusted_lr_factor(mode, shape, flatten);
}

float adjusted_lr_factor(AdjustLR mode, c10::IntArrayRef shape, bool flatten) {
  return mode == AdjustLR::NONE ? 1.0f : static_cast<float>(adjust_factor(mode, shape, flatten));
}

std::vector<double> split_lr_scales(const std::vector<int64_t>& split_sizes, c10::IntArrayRef shape, AdjustLR mode) {
  if (mode == AdjustLR::NONE) return {};
  const double full = adjust_factor(mode, shape, false);
  std::vector<double> out;
  for (int64_t rows : split_sizes) {
    const int64_t block[2] = {rows, shape.back()};
    out.push_back(adjust_factor(mode, c10::IntArrayRef(block, 2), false) / full);
  }
  return out;
}

}  // namespace dion::math
