// dion/cuda/fused.h — fused CUDA kernels for the optimizers' element-wise post step.
//
//   dion::cuda::available()                      compiled with CUDA kernels (DION_HAVE_CUDA)
//   dion::cuda::decay_and_update_(X, U, decay, neg_lr)
//       X = decay * X + neg_lr * U, one pass, float32 math; X float32 or bf16, U float32 or bf16,
//       both contiguous CUDA tensors of one shape. The unfused form is two kernels and an
//       intermediate tensor (X.mul_(decay); X.add_(U * neg_lr)).
//
// The GPU optimizer path is built on these; on CPU (or without CUDA) the library uses ATen ops.
// Calling a kernel in a build without CUDA throws std::runtime_error.
#pragma once

#include <ATen/core/Tensor.h>

namespace dion::cuda {

bool available();

void decay_and_update_(at::Tensor& X, const at::Tensor& U, float decay, float neg_lr);

}  // namespace dion::cuda
