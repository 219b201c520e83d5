// dion/math/normuon.h — NorMuon's per-neuron normalization (arXiv 2510.05491).
//
// After Muon's orthogonalization U [N, .., m, n]:
//   V = lerp(V, mean_j U_ij^2, 1 - beta2)          per-neuron (row) second moment, V [N, .., m, 1]
//   U' = U / (sqrt(V) + 1e-8)
//   U' *= ||U||_F / max(||U'||_F, 1e-8)            keep the update's Frobenius norm
// Computed in V's dtype. With split_sizes, each row block is normalized on its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace dion::math {

// Returns (U', V'). U [N, .., m, n] any float dtype; V [N, .., m, 1].
std::pair<at::Tensor, at::Tensor> normuon_normalize(const at::Tensor& U, const at::Tensor& V,
                                                    float beta2,
                                                    const std::vector<int64_t>& split_sizes = {});

}  // namespace dion::math
