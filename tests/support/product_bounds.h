// tests/support/product_bounds.h — how far two evaluations of one matrix product may differ.
//
// What it is: the tolerance of the symmetric-product tests (test_ortho_fast on CPU, test_cuda on
// a GPU), which compare block rows + mirror with one full product; not a test itself.
//
// Derivation. Both evaluations of P = beta S + alpha M1 M2 accumulate each entry's k-term dot
// product in fp32, in some order (block rows, tiles, split-K: any order), and round the result
// to P's dtype once. A sum of k products in fp32 is within gamma_k = k u / (1 - k u), u = 2^-24,
// of the exact one, relative to the sum of the |terms| (Higham, Accuracy and Stability, 3.1):
//   |fl(P_ij) - P_ij| <= |alpha| gamma_k (|M1| |M2|)_ij + u |beta S_ij|,
// so two evaluations differ by twice that before rounding; rounding each to the result dtype
// moves it by at most half an ulp, and ulp(v) <= 2^(1 - p) |v| for a p-bit significand (bf16
// p = 8, fp16 11, fp32 24): together <= 2^(1 - p) max |P|. The bound below is the sum, taken
// at the largest entry: a block in the wrong place, a missing block or a missing mirror is off
// by O(max |P|) when the inputs' entries do not average out (see offset_rows).
#pragma once

#include <ATen/ATen.h>

#include <cmath>

namespace dion::testing {

inline double significand_bits(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return 8;
    case at::kHalf:
      return 11;
    case at::kDouble:
      return 53;
    default:
      return 24;
  }
}

// Bound on max |P - Q| for two evaluations of beta S + alpha M1 @ M2 (S may be undefined).
// M1 [B, m, k], M2 [B, k, m], Q [B, m, m]: one of the two results.
inline double product_difference_bound(const at::Tensor& M1, const at::Tensor& M2, double alpha, const at::Tensor& S,
                                       double beta, const at::Tensor& Q) {
  const double u = std::ldexp(1.0, -24), k = static_cast<double>(M1.size(-1));
  const double gamma = k * u / (1 - k * u);
  const double terms = at::matmul(M1.to(at::kDouble).abs(), M2.to(at::kDouble).abs()).max().item<double>();
  const double s = S.defined() ? S.to(at::kDouble).abs().max().item<double>() : 0.0;
  const double rounding = std::ldexp(1.0, 1 - static_cast<int>(significand_bits(Q.scalar_type())));
  return 2 * (std::abs(alpha) * gamma * terms + u * std::abs(beta) * s) +
         rounding * Q.to(at::kDouble).abs().max().item<double>();
}

// X [B, m, k] of unit normal entries plus a random offset per row: every entry of X X^T is then
// of the order of k (not sqrt(k) off the diagonal), so that any misplaced block is visible.
inline at::Tensor offset_rows(at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::randn(shape, options) * 0.5 + at::randn({shape[0], shape[1], 1}, options);
}

}  // namespace dion::testing
