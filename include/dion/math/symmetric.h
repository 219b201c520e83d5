// dion/math/symmetric.h — matrix products whose result is known to be symmetric, on CPU and CUDA.
//
// What it is: P = beta * S + alpha * (M1 @ M2) for batches of square results that the caller
// knows are symmetric (X X^T; a polynomial in R times another polynomial in R), computed as
// the lower triangle of row blocks plus a mirror of the strictly upper part:
//   block row i (rows [i0, i1)) = beta * S[i0:i1, :i1] + alpha * M1[i0:i1, :] @ M2[:, :i1]
// written in place into P (no temporary), then the strictly upper blocks are copied from the
// lower ones by a blocked transpose. With T blocks the product costs (T + 1) / (2 T) of the
// full one: 0.625 at T = 4.
//   - CPU: one 2-D at::addmm_out per block row and matrix, the mirror a cache-blocked loop.
//     Below the thresholds below (or with tiled = false) it is one batched at::baddbmm_out /
//     at::bmm_out over the whole batch instead: on this CPU oneDNN's batched small products
//     run at their full rate while block rows of a small matrix lose more to per-call costs
//     than the triangle saves (measured by dion-bench; see docs/benchmarks.md).
//   - CUDA, with the project's own CUDA kernels turned on (dion/math/own_kernels.h; off by
//     default: then one full batched product, cuBLAS through ATen): one at::baddbmm_out per
//     block row over the whole batch (3-D slices of P, M1, M2: a strided-batched cuBLAS GEMM
//     that writes P's rows in place with ldc = m), then the mirror kernel of
//     dion/cuda/symmetric.h. The block height comes from cuda_symmetric_block_rows (the
//     reasoning is there); a batch too small to fill the GPU's multiprocessors with a first
//     block row takes the full product.
// symmetric_product_block_rows_out is the batched block-row path with an explicit height, on
// any device: the CUDA path's code, testable on a CPU, and what the device benchmark sweeps.
// batched_product_out is the fast path's other product (not symmetric), with the same CPU rule
// for fp16 / bf16 without native GEMMs (half_product_in_fp32, below).
//
// What it is not: no check that the product is in fact symmetric (the caller's algebra says
// so); not one kernel launch for all tiles of the triangle (the reference's Triton kernels skip
// the tiles above the diagonal inside one launch; cuBLAS block rows need one launch per row).
//
// Shapes: P, S [B, m, m]; M1 [B, m, k]; M2 [B, k, m]; all in one dtype, P contiguous.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::math {

// When the CPU block-row path is used: from kSymmetricMinRows rows, or from kSymmetricMinRowsLongK
// rows when the reduction is at least kSymmetricLongK long (X X^T of a 1:4 matrix). Measured
// with dion-bench (one thread, bf16): per-matrix block rows beat one batched product for
// 768 x 3072 (K = 3072, 10-20 % faster) and 2048 x 2048, and lose to it for 512 x 512 and
// 768 x 768 batches (K = 512, 768: 10-20 % slower), where the smaller GEMMs' per-call costs
// exceed the saved flops.
constexpr int64_t kSymmetricMinRows = 1024;
constexpr int64_t kSymmetricMinRowsLongK = 512;
constexpr int64_t kSymmetricLongK = 2048;
// Rows per block row on CPU (the last block takes the remainder).
constexpr int64_t kSymmetricBlockRows = 256;

// CUDA: block heights are multiples of kCudaSymmetricTile rows, at most kCudaSymmetricMaxBlocks
// block rows, from kCudaSymmetricMinRows rows (see cuda_symmetric_block_rows).
constexpr int64_t kCudaSymmetricTile = 128;
constexpr int64_t kCudaSymmetricMaxBlocks = 4;
constexpr int64_t kCudaSymmetricMinRows = 512;

// Rows per block row for `batch` m x m results on a GPU with `multiprocessors` SMs; 0: one full
// product. Not measured yet (no GPU run so far; bench/device_bench.cpp times both ways), chosen
// from the reference's kernel and flop counts:
//   - heights are multiples of 128, the reference's largest BLOCK_SIZE_M and the CTA tile
//     height of cuBLAS's bf16 kernels on Hopper, so that a block row ends on a tile boundary
//     and no tile computes rows that are thrown away;
//   - the first (smallest) block row, batch x (h / 128)^2 tiles of 128 x 128, must fill one
//     wave of the multiprocessors: a block row that leaves SMs idle costs a full wave for part
//     of one, and the saved flops go into idle SMs;
//   - at most 4 block rows (0.625 of the flops; 8 would give 0.5625 for twice the launches):
//     each block row is a kernel launch, a few microseconds, against full products of 20-100
//     microseconds for the 160M model's matrices on an H200;
//   - at least 2 block rows after the short last one is merged (below 512 rows a product takes
//     a few microseconds and launches would eat the saving).
// For the 160M model on an H200 (132 SMs): [48, 768, 768] -> 256 (3 block rows, 0.67 of the
// flops), [12, 768, 768 or 3072] -> 512 (2 block rows, 0.78).
int64_t cuda_symmetric_block_rows(int64_t batch, int64_t m, int64_t multiprocessors);

// P = beta * S + alpha * M1 @ M2, the result symmetric. S may be undefined (then beta is 0).
// P must not alias M1, M2 or S (S may alias nothing but itself). tiled = false: one full
// batched product (the reference's operation, for the exact path and for checking).
void symmetric_product_out(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S,
                           double beta, double alpha, bool tiled = true);

// The batched block-row path (the CUDA path's code) with `block_rows` rows per block on any
// device, a short last block (< block_rows / 2) merged into the one before; then the mirror.
void symmetric_product_block_rows_out(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2,
                                      const at::Tensor& S, double beta, double alpha, int64_t block_rows);

// P = X @ X^T (X [B, m, k] contiguous), the Gram matrix, by the same block rows.
void gram_out(const at::Tensor& P, const at::Tensor& X, bool tiled = true);

// out = beta * S + alpha * M1 @ M2 (S undefined: alpha * M1 @ M2) as one batched product, for
// results that are not symmetric (the polynomial applied to X). out [B, m, n] contiguous.
void batched_product_out(const at::Tensor& out, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S,
                         double beta, double alpha);

// fp16 / bf16 products on a CPU whose GEMMs in that dtype are not native (cpu_has_native_gemm,
// dion/math/ortho.h: a Zen 3, fp16 on a Zen 4 / 5, or under an ONEDNN_MAX_CPU_ISA cap): both
// functions above then multiply the operands' values in fp32 (oneDNN's fp32 GEMM) and round the
// result to the dtype once, which is the arithmetic of a native bf16 / fp16 GEMM (fp32
// accumulation, one rounding of beta * S + alpha * M1 @ M2) with another summation order; ATen's
// own loops there run at 0.5-16 GFLOP/s against 70-90 for fp32 on an AMD Zen 3 (the fast path
// forced to bf16: see docs/benchmarks.md). Where block rows and the mirror run, the result stays
// exactly symmetric (the mirror copies fp32 bits, each rounded alike). The exact path never comes
// here: its bits are ATen's (dion/math/bf16_matmul_cpu.h).
bool half_product_in_fp32(const at::Tensor& out);

// Copies P's strictly lower triangle onto its strictly upper triangle, for every matrix of a
// contiguous batch P [B, m, m], from row `from_row` on (rows above it are left as they are).
// CPU: a cache-blocked loop; CUDA: the kernel of dion/cuda/symmetric.h when the own kernels are
// on (dion/math/own_kernels.h), else mirror_lower_to_upper_with_aten_ops.
void mirror_lower_to_upper(const at::Tensor& P, int64_t from_row = 0);

// The same with ATen ops on any device (a mask and at::where: one [B, m, m] temporary): what
// CUDA tensors get while the mirror kernel is off. Equal to the loop and the kernel bit for bit
// (a copy of values).
void mirror_lower_to_upper_with_aten_ops(const at::Tensor& P, int64_t from_row = 0);

}  // namespace dion::math
