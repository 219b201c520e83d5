// NorMuon normalization (see include/dion/math/normuon.h).
#include "dion/math/normuon.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "dion/math/elementwise.h"

namespace dion::math {

namespace {
// ||T||_F over dims (-2, -1), keepdim; summed over shards when the matrices are sharded.
at::Tensor frobenius(const at::Tensor& T, const ShardSum& sum_over_shards) {
  static constexpr int64_t kMatrixDims[] = {-2, -1};
  if (!sum_over_shards) return at::linalg_vector_norm(T, 2, at::IntArrayRef(kMatrixDims), true);
  at::Tensor sq = T.square().sum(at::IntArrayRef(kMatrixDims), /*keepdim=*/true).contiguous();
  sum_over_shards(sq);
  return sq.sqrt();
}

std::pair<at::Tensor, at::Tensor> normalize_core(const at::Tensor& U_in, const at::Tensor& V, float beta2,
                                                 const ShardSum& sum_over_shards, const ColumnShards& cols) {
  at::Tensor U = U_in.to(V.scalar_type());
  at::Tensor norm_U = frobenius(U, sum_over_shards);
  at::Tensor neuron;  // [.., m, 1]: mean over the whole row of U^2
  if (cols.sum_over_columns) {
    neuron = (U * U).sum(-1, /*keepdim=*/true).contiguous();
    cols.sum_over_columns(neuron);
    neuron = neuron / static_cast<double>(cols.columns);
  } else {
    neuron = (U * U).mean(-1, /*keepdim=*/true);
  }
  at::Tensor weight = at::scalar_tensor(1.0f - beta2, at::kFloat);  // 0-d float32, as reference
  at::Tensor V_new = at::lerp(V, neuron, weight);
  at::Tensor normalized = U / (V_new.sqrt() + 1e-8);
  at::Tensor norm_new = frobenius(normalized, sum_over_shards).clamp_min(1e-8);
  normalized = normalized * (norm_U / norm_new);
  return {normalized, V_new};
}
}  // namespace

std::pair<at::Tensor, at::Tensor> normuon_normalize(const at::Tensor& U, const at::Tensor& V, float beta2,
                                                    const std::vector<int64_t>& split_sizes,
                                                    const ShardSum& sum_over_shards,
                                                    const ColumnShards& column_shards) {
  RECORD_USER_SCOPE("dion::normuon_normalize");
  if (split_sizes.empty()) return normalize_core(U, V, beta2, sum_over_shards, column_shards);
  std::vector<at::Tensor> us = U.split_with_sizes(split_sizes, -2);
  std::vector<at::Tensor> vs = V.split_with_sizes(split_sizes, -2);
  std::vector<at::Tensor> out_u, out_v;
  for (size_t i = 0; i < us.size(); ++i) {
    auto [u, v] = normalize_core(us[i], vs[i], beta2, sum_over_shards, column_shards);
    out_u.push_back(u);
    out_v.push_back(v);
  }
  return {at::cat(out_u, -2), at::cat(out_v, -2)};
}

bool normuon_update_fast(at::TensorList X, const at::Tensor& O, at::TensorList V, at::TensorList indices, float beta2,
                         float lr, float adjusted_lr, float weight_decay) {
  RECORD_USER_SCOPE("dion::normuon_update_fast");
  const int64_t N = static_cast<int64_t>(X.size());
  if (N == 0 || O.dim() != X[0].dim() + 1 || O.size(0) != N || !cpu::cpu_fusable(O, O) || V.size() != X.size() ||
      (!indices.empty() && (indices.size() != X.size() || X[0].dim() != 2)))
    return false;
  for (int64_t i = 0; i < N; ++i)
    if (!cpu::cpu_fusable(X[i], X[i]) || !cpu::cpu_fusable(V[i], V[i]) || V[i].numel() * X[i].size(-1) != X[i].numel())
      return false;
  const int64_t m = X[0].size(-2), n = X[0].size(-1), k = O.size(-2);
  for (int64_t i = 0; i < N; ++i) {
    const at::Tensor x = X[i].reshape({-1, m, n}), u = O[i].reshape({-1, k, n}), v = V[i].reshape({-1, m, 1});
    for (int64_t h = 0; h < x.size(0); ++h)
      cpu::normuon_update_(x[h], u[h], v[h], indices.empty() ? at::Tensor() : indices[static_cast<size_t>(i)], beta2,
                           1.0f - lr * weight_decay, -adjusted_lr);
  }
  return true;
}

}  // namespace dion::math
