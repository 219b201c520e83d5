// dion/math/symmetric.h — matrix products whose result is known to be symmetric, on CPU.
//
// What it is: P = beta * S + alpha * (M1 @ M2) for batches of square results that the caller
// knows are symmetric (X X^T; a polynomial in R times another polynomial in R), computed as
// the lower triangle of row blocks plus a mirror of the strictly upper part:
//   block row i (rows [i0, i1)) = beta * S[i0:i1, :i1] + alpha * M1[i0:i1, :] @ M2[:, :i1]
// one at::addmm_out per block row and matrix, written in place into P (no temporary), then the
// strictly upper blocks are copied from the lower ones by a cache-blocked transpose. With T
// blocks the product costs (T + 1) / (2 T) of the full one: 0.625 at T = 4.
// Below the thresholds below (or with tiled = false) it is one batched at::baddbmm_out /
// at::bmm_out over the whole batch instead: on this CPU oneDNN's batched small products run
// at their full rate while block rows of a small matrix lose more to per-call costs than the
// triangle saves (measured by dion-bench; see docs/benchmarks.md).
//
// What it is not: no check that the product is in fact symmetric (the caller's algebra says
// so); no GPU path (on a GPU the reference's Triton kernels do the same per tile).
//
// Shapes: P, S [B, m, m]; M1 [B, m, k]; M2 [B, k, m]; all in one dtype, P contiguous.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::math {

// When the block-row path is used: from kSymmetricMinRows rows, or from kSymmetricMinRowsLongK
// rows when the reduction is at least kSymmetricLongK long (X X^T of a 1:4 matrix). Measured
// with dion-bench (one thread, bf16): per-matrix block rows beat one batched product for
// 768 x 3072 (K = 3072, 10-20 % faster) and 2048 x 2048, and lose to it for 512 x 512 and
// 768 x 768 batches (K = 512, 768: 10-20 % slower), where the smaller GEMMs' per-call costs
// exceed the saved flops.
constexpr int64_t kSymmetricMinRows = 1024;
constexpr int64_t kSymmetricMinRowsLongK = 512;
constexpr int64_t kSymmetricLongK = 2048;
// Rows per block row (the last block takes the remainder).
constexpr int64_t kSymmetricBlockRows = 256;

// P = beta * S + alpha * M1 @ M2, the result symmetric. S may be undefined (then beta is 0).
// P must not alias M1, M2 or S (S may alias nothing but itself). tiled = false: one full
// batched product (the reference's operation, for the exact path and for checking).
void symmetric_product_out(const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2,
                           const at::Tensor& S, double beta, double alpha, bool tiled = true);

// P = X @ X^T (X [B, m, k] contiguous), the Gram matrix, by the same block rows.
void gram_out(const at::Tensor& P, const at::Tensor& X, bool tiled = true);

// Copies P's strictly lower triangle onto its strictly upper triangle, for every matrix of a
// contiguous batch P [B, m, m], from row `from_row` on (rows above it are left as they are).
void mirror_lower_to_upper(const at::Tensor& P, int64_t from_row = 0);

}  // namespace dion::math
