// src/math/scalar_tensor.h — hyperparameters as 0-d float32 tensors (internal).
//
// The reference hands hyperparameters to the kernels as 0-d float32 tensors. For bf16 tensors
// that is not the same as a C++ Scalar: an in-place op with a Scalar (x.mul_(0.95)) rounds
// differently from one with a 0-d float32 tensor (tests/optim/test_reference.cpp, the bf16 cases), so
// the math uses these wherever the reference does.
#pragma once

#include <ATen/ATen.h>

namespace dion::math {

inline at::Tensor f32(float value) { return at::scalar_tensor(value, at::kFloat); }

}  // namespace dion::math
