// tests/support/matrices.h — test inputs with chosen singular values, and their measurement.
//
// What it is: helpers shared by the orthogonalizer tests (test_ortho, test_ortho_fast); not a
// test itself, and not used by the library.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace dion::testing {

// U diag(S) V^T in float64 with random orthonormal U [.., m, k], V [.., n, k] and the given
// singular values S [.., k] (k = min(m, n)); returned in float32.
inline at::Tensor with_singular_values(std::vector<int64_t> shape, const at::Tensor& S) {
  const int64_t m = shape[shape.size() - 2], n = shape.back(), k = std::min(m, n);
  std::vector<int64_t> batch(shape.begin(), shape.end() - 2);
  std::vector<int64_t> su = batch, sv = batch;
  su.insert(su.end(), {m, k});
  sv.insert(sv.end(), {n, k});
  at::Tensor U = std::get<0>(at::linalg_qr(at::randn(su, at::kDouble)));
  at::Tensor V = std::get<0>(at::linalg_qr(at::randn(sv, at::kDouble)));
  return at::matmul(U * S.unsqueeze(-2), V.mT()).to(at::kFloat);
}

// Singular values log-uniform in [smin, 1] (condition number <= 1 / smin).
inline at::Tensor conditioned(const std::vector<int64_t>& shape, double smin) {
  const int64_t k = std::min(shape[shape.size() - 2], shape.back());
  std::vector<int64_t> ss(shape.begin(), shape.end() - 2);
  ss.push_back(k);
  at::Tensor S = at::exp(at::empty(ss, at::kDouble).uniform_(std::log(smin), 0.0));
  return with_singular_values(shape, S);
}

inline at::Tensor svdvals(const at::Tensor& X) { return at::linalg_svdvals(X.to(at::kDouble)); }

inline bool all_finite(const at::Tensor& X) { return at::isfinite(X).all().item<bool>(); }

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace dion::testing
