// src/train/model/cross_entropy_cpu.h — the one-pass cross entropy over CPU logits, bf16 or fp32
// (private to src/train/model; kernels.cpp's fast kind uses it).
//
// cross_entropy_inplace(logits [N, V], contiguous, bf16 or fp32; targets [N] int64) reads each
// row as fp32 and computes, per row, m = max, s = sum exp(x - m), the row's loss
// m + log s - x[target] (the reference's log-softmax and NLL in fp32), and with `grad` writes
// d(loss)/d(logits) = (exp(x - m) / s - onehot(target)) * scale over the logits (bf16: rounded to
// nearest even, as ATen's fp32 -> bf16). A row whose target is ignore_index has loss 0 and
// gradient 0. With `row_factor` (and `grad`) the gradient is left unscaled, one pass fewer: the
// logits become G' = exp(x - m) with s subtracted at the target (bf16: each rounded once), and
// *row_factor an fp32 [N] of k = scale / s (0 for an ignored row, whose G' is 0), so that the
// gradient is diag(k) G' (k e - scale at the target: k (e - s)); the caller applies k to the
// GEMMs' [N, C] sides (dh = diag(k) (G' w), dW = G'^T (diag(k) h)) instead of to the [N, V] logits.
// Returns the sum of the rows' losses (in row order, double). Rows run in parallel
// (at::parallel_for); the result does not depend on the thread count. Each row is read from
// memory once: at V = 50304 a row is 201 KB (fp32), which stays in the cache for the exp and
// gradient passes (ATen's log-softmax, exp, scatter and scale each stream the whole [N, V]).
//
// Where it runs (cross_entropy_inplace_available):
//   - bf16 and fp32 on a CPU with AVX-512 F, BW and VL (Intel Skylake-SP and later, AMD Zen 4 and
//     later) while ATen runs its AVX-512 kernels;
//   - fp32 on a CPU with AVX2 and FMA (AMD Zen 3) while ATen runs at least its AVX2 kernels.
// The kernels are compiled for those instruction sets with function attributes (the rest of the
// program is not); elsewhere callers take ATen's ops. exp is vec_exp.h's (inline, within 0.92 ulp;
// the values differ from Sleef's, which ATen's exp calls, in about 1% of the elements by an ulp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::train {

bool cross_entropy_inplace_available(at::ScalarType dtype);

// Tests: `on` makes the bf16 kernel take its portable fp32 -> bf16 conversion even where the CPU
// has AVX512_BF16 (as an AVX-512 CPU without it would); off again restores the CPU's choice.
void cross_entropy_force_portable_bf16(bool on);

double cross_entropy_inplace(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index, float scale,
                             bool grad, at::Tensor* row_factor = nullptr);

}  // namespace dion::train
