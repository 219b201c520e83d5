// dion/train/kernels.h — the GEMMs and the loss the GPT computes with, in one of two kinds.
//
//   Kernels::exact  ATen's calls, in the reference's order: at::linear, one cross_entropy over
//                   the full fp32 logits. Equal to the reference's GPT to rounding (tests/train
//                   compare bit for bit); the GPT module's default.
//   Kernels::fast   the same math, faster on a CPU:
//     - every GEMM of a linear (forward, dx, dW) through oneDNN (`mkldnn::_linear_pointwise`,
//       LibTorch's own oneDNN) on CPU fp32 / bf16 tensors, where the build has it; at::mm
//       elsewhere. Measured on an AMD EPYC (Zen 5, no AMX, 1 thread): 2-2.5x MKL's fp32 sgemm
//       on the lm_head's [1024, 128] x [128, 50304] (docs/benchmarks.md).
//     - the lm_head and the cross entropy fused and chunked by rows (linear_cross_entropy): per
//       chunk of kCrossEntropyChunkRows rows the logits, their logsumexp, the loss and, when a
//       gradient is wanted, d(loss)/d(logits) in place, then dh and dW; the [N, V] logits and
//       their gradient never exist whole (the dominant allocation of the exact kind).
//   The fast kind's loss and gradients equal the exact kind's to fp32 rounding of a different
//   summation order (tests/train/test_kernels.cpp states and checks the tolerances).
//
// Autocast: under bf16 autocast both kinds compute their GEMMs in bf16 as at::linear would
// (inputs cast to bf16, differentiably), the loss in fp32 over bf16-rounded logits as the
// reference's `logits.float()`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::train {

enum class Kernels { exact, fast };

inline constexpr int64_t kCrossEntropyChunkRows = 256;  // logits chunk [256, V]: ~51 MB fp32 at V = 50304

// True when oneDNN's linear is registered in this LibTorch build (fast GEMMs on CPU).
bool onednn_linear_available();

// a [M, K] @ b [K, N] -> [M, N]; no autograd. `fast`: oneDNN on CPU float / bf16, else at::mm.
at::Tensor matmul_2d(const at::Tensor& a, const at::Tensor& b, Kernels kind);

// x [.., in] times w [out, in] transposed -> [.., out], no bias, differentiable in x and w
// (at::linear for exact; oneDNN forward and backward for fast).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, Kernels kind);

// Mean cross entropy of logits = h w^T (h [N, C], w [V, C], targets [N] int64, ignore_index
// rows excluded from the mean, as F.cross_entropy), differentiable in h and w; fp32 scalar.
// exact: at::linear + at::cross_entropy_loss over the full logits; fast: fused and chunked
// (the gradients are computed in the forward when autograd wants them, kept for backward).
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, Kernels kind,
                                int64_t ignore_index = -1);

}  // namespace dion::train
