// dion/math/lr.h — learning-rate adjustments shared by the orthonormal optimizers.
//
//   spectral_norm: lr * sqrt(fan_out / fan_in)     (RMS->RMS operator norm 1; lr transfer)
//   rms_norm:      lr * 0.2 * sqrt(max(fan_out, fan_in))   (matches an adaptive update's RMS)
//   none:          lr
// fan_out, fan_in are the last two dims, or (dim 0, prod(rest)) when flatten is set.
// Values are computed in float32, as the reference computes them on 0-d float32 tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace dion::math {

enum class AdjustLR { SPECTRAL_NORM, RMS_NORM, NONE };

// "spectral_norm" | "rms_norm" | "none"; throws std::invalid_argument naming the valid values.
AdjustLR adjust_lr_from_string(const std::string& name);
std::string to_string(AdjustLR mode);

// The adjusted learning rate for a parameter of `shape` (the parameter's global shape).
float adjusted_lr(float lr, AdjustLR mode, c10::IntArrayRef shape, bool flatten);
// The float32 factor adjusted_lr multiplies lr by (1 for NONE): adjusted_lr = lr * factor.
float adjusted_lr_factor(AdjustLR mode, c10::IntArrayRef shape, bool flatten);

// The whole-matrix factor adjust(shape) / lr, in double (used for ratios).
double adjust_factor(AdjustLR mode, c10::IntArrayRef shape, bool flatten);

// Per-row-block corrections for split_sizes: adjust(block) / adjust(full) for each block, so
// that a fused weight's blocks step as separate parameters would. Empty for AdjustLR::NONE.
std::vector<double> split_lr_scales(const std::vector<int64_t>& split_sizes, c10::IntArrayRef shape, AdjustLR mode);

}  // namespace dion::math
