// dion/train/kernels.h — the GEMMs and the loss the GPT computes with, in one of two kinds.
//
//   Kernels::exact  ATen's calls, in the reference's order: at::linear, one cross_entropy over
//                   the full fp32 logits. Equal to the reference's GPT to rounding (tests/train
//                   compare bit for bit); the GPT module's default.
//   Kernels::fast   the same math, faster on a CPU:
//     - every fp32 GEMM of a linear (forward, dx, dW) through oneDNN (`mkldnn::_linear_pointwise`,
//       LibTorch's own oneDNN) on an AMD CPU, where the build has it; at::mm (MKL) on an Intel one
//       and elsewhere (bf16 on the CPU: ATen's mm is oneDNN's bf16 GEMM already). Measured on an
//       AMD EPYC (Zen 5, 1 thread): oneDNN 2-2.5x MKL's fp32 sgemm on the lm_head's [1024, 128] x
//       [128, 50304]; on an Intel Xeon the two are equal (docs/benchmarks.md).
//     - the lm_head and the cross entropy fused and chunked by rows in fp32 (linear_cross_entropy):
//       per chunk of kCrossEntropyChunkRows rows the logits, then one pass of a loss kernel of
//       our own over each row (src/train/model/cross_entropy_cpu.h: AVX-512 or AVX2; ATen's
//       log-softmax elsewhere): the loss and, when a gradient is wanted, d(loss)/d(logits) in
//       place, then dh and dW; the [N, V] logits and their gradient never exist whole (the
//       dominant allocation of the exact kind).
//     - in bf16 (autocast, or bf16 operands) on a CPU with AVX-512: the bf16 logits in one GEMM,
//       then one pass of the same loss kernel over them (src/train/model/cross_entropy_cpu.h:
//       fp32 max, exp and sum per row, as the reference's `logits.float()` and log-softmax),
//       which writes the bf16 gradient over the logits; dh and dW as bf16 GEMMs. No fp32
//       [N, V] tensor exists (ATen's loss makes about ten passes over such tensors).
//     - in the GPT's blocks on the CPU (src/train/model/fused_cpu.h), fp32 and bf16: the rotary and
//       relu^2 as one pass each way, ATen's operations and roundings in ATen's order (the same
//       bits), and the RMSNorm as one pass each way (its row sums in another order).
//     - causal attention in bf16 on the CPU at short sequences (causal_attention): ATen's fp32
//       flash attention on the bf16 operands made fp32, the output rounded to bf16 once.
//   The fast kind's loss and gradients equal the exact kind's to fp32 rounding of a different
//   summation order, and in bf16 to one bf16 rounding (tests/train/model/test_kernels.cpp states and
//   checks the tolerances).
//
// Elsewhere (bf16 without AVX-512, other dtypes, CUDA) the fast kind is ATen's calls
// (at::linear, at::cross_entropy_loss over the logits as fp32).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::train {

enum class Kernels { exact, fast };

inline constexpr int64_t kCrossEntropyChunkRows = 256;  // logits chunk [256, V]: ~51 MB fp32 at V = 50304

// True when oneDNN's linear is registered in this LibTorch build (fast GEMMs on CPU).
bool onednn_linear_available();

// Whether a product's row count repeats from call to call: `varies` for an expert's block of
// tokens, whose count changes every step. oneDNN builds (JIT) and caches a kernel per shape, and
// such products missed its cache on nearly every call (the MoE on an AMD Zen 4, 2026-12-07: 31 ms
// a step in building kernels and its LRU cache, 30 more in malloc and page faults); through oneDNN
// they run on their rows rounded up to a multiple of 32 (the rows that follow them in their
// storage, or zeros), whose kernels repeat, and the result's first rows are kept; so do bf16 ones
// (ATen's bf16 mm is oneDNN's). A bf16 product whose reduction runs over those rows (a = X^T: a
// weight gradient) is two, over the rows rounded down to 32 and over the rest, added.
enum class Shape { repeats, varies };

// a [M, K] @ b [K, N] -> [M, N]; no autograd. `fast`: oneDNN for CPU fp32 where the CPU's plan
// says so (DION_FAST_FP32, docs/train.md), else at::mm.
at::Tensor matmul_2d(const at::Tensor& a, const at::Tensor& b, Kernels kind, Shape shape = Shape::repeats);

// The same product written into `out` [M, N] (e.g. a block of rows of a larger buffer, so that
// grouped GEMMs fill one output without a cat): at::mm_out, or oneDNN's result copied in.
void matmul_2d_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, Kernels kind,
                   Shape shape = Shape::repeats);

// The three GEMMs of a linear without autograd, for autograd functions of their own (FSDP's
// resharded linear): y = x w^T [.., out]; dx = dy w reshaped to x_sizes; dW = dy^T x over the
// flattened leading dims [out, in]. exact: at::linear and at::mm (at::linear's own backward).
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& w, Kernels kind);
at::Tensor linear_dx(const at::Tensor& dy, const at::Tensor& w, at::IntArrayRef x_sizes, Kernels kind);
at::Tensor linear_dw(const at::Tensor& dy, const at::Tensor& x, Kernels kind);

// x [.., in] times w [out, in] transposed -> [.., out], no bias, differentiable in x and w
// (at::linear, or for fast on fp32 with autocast off the three GEMMs above in oneDNN).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, Kernels kind);

// Causal self-attention, F.scaled_dot_product_attention(q, k, v, is_causal=True): q, k, v
// [B, H, T, D] -> [B, H, T, D], differentiable. exact: that ATen call. fast: the same, except on
// the CPU where the attention computes in bf16 (autocast to bf16, or bf16 operands) and
// attention_upcasts(T) holds: then ATen's fp32 flash attention over the bf16 operands made fp32
// (exact values), its output rounded to bf16 once; gradients come back through the casts. ATen's
// bf16 flash attention runs its 32-row query blocks as small bf16 GEMMs, each a oneDNN call
// (their set-up and allocations cost more than their products at short T) and keeps P in bf16;
// the fp32 one is faster there and closer to exact arithmetic (the scores, P and the
// accumulations in fp32). Measured on an AMD Zen 4 (bench/attention_speed.py, one thread,
// forward + backward; bench/results/attention/zen4_2026-12-07.md): [8, 4, 128, 32] 15.9 -> 6.4 ms,
// the gradients' largest error against fp64 0.031 -> 0.002; D 64 1.52x; T 256 1.28x; T 384
// 1.02-1.21x; T 512 0.96x; T 1024 0.80-0.85x (hence kAttentionUpcastMaxT).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Kernels kind);

// Where the fast kind's bf16 attention on the CPU goes through fp32: T <= kAttentionUpcastMaxT,
// or any T where ATen's bf16 products are its own loops rather than oneDNN's (a CPU without bf16
// GEMMs: dion::math::aten_bf16_matmul_uses_onednn() false).
inline constexpr int64_t kAttentionUpcastMaxT = 256;
bool attention_upcasts(int64_t T);

// Mean cross entropy of logits = h w^T (h [N, C], w [V, C], targets [N] int64, ignore_index
// rows excluded from the mean, as F.cross_entropy), differentiable in h and w; fp32 scalar.
// exact: at::linear + at::cross_entropy_loss over the full logits; fast: fused and chunked in
// fp32, the bf16 loss kernel in bf16 (both compute the gradients in the forward when autograd
// wants them and keep them for backward), else as exact.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, Kernels kind,
                                int64_t ignore_index = -1);

}  // namespace dion::train
