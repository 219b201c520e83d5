// src/train/model/cross_entropy_bf16.h — the one-pass cross entropy over bf16 logits (private to
// src/train/model; kernels.cpp's fast kind uses it under bf16).
//
// cross_entropy_bf16_inplace(logits [N, V] bf16, contiguous; targets [N] int64) reads each row
// of bf16 logits as fp32 and computes, per row, m = max, s = sum exp(x - m), the row's loss
// m + log s - x[target] (the reference's log-softmax and NLL in fp32), and with `grad` writes
// d(loss)/d(logits) = (exp(x - m) / s - onehot(target)) * scale over the logits, rounded to bf16
// (round to nearest even, as ATen's fp32 -> bf16). A row whose target is ignore_index has loss 0
// and gradient 0. Returns the sum of the rows' losses (in row order, double). Rows run in
// parallel (at::parallel_for); the result does not depend on the thread count.
//
// Where it runs: a CPU with AVX-512 F, BW and VL (Intel Skylake-SP and later, AMD Zen 4 and
// later; the kernel is compiled for it with a function attribute, the rest of the program is
// not); elsewhere cross_entropy_bf16_available() is false and callers take ATen's ops. exp is
// Sleef's expf16_u10 (the one ATen's vectorized exp calls, exported by LibTorch).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::train {

bool cross_entropy_bf16_available();

double cross_entropy_bf16_inplace(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index, float scale,
                                  bool grad);

}  // namespace dion::train
