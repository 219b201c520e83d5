// NorDion2 / Dion3 normalization of the selected rows (see include/dion/math/nordion2.h).
#include "dion/math/nordion2.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "dion/math/normuon.h"
#include "scalar_tensor.h"

namespace dion::math {

std::pair<at::Tensor, at::Tensor> nordion2_normalize_selected(const at::Tensor& U,
                                                              const at::Tensor& V,
                                                              const at::Tensor& indices,
                                                              float beta2,
                                                              const ShardSum& sum_over_shards,
                                                              const ColumnShards& column_shards) {
  RECORD_USER_SCOPE("dion::nordion2_normalize");
  at::Tensor idx = indices.unsqueeze(-1);                              // [N, .., k, 1]
  at::Tensor V_sel = at::gather(V, -2, idx).to(at::kFloat);            // [N, .., k, 1]
  auto [U_normed, V_sel_new] = normuon_normalize(U, V_sel, beta2, {}, sum_over_shards, column_shards);
  at::Tensor V_new = V.scatter(-2, idx, V_sel_new.to(V.scalar_type()));
  return {U_normed, V_new};
}

void nordion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList V, at::TensorList U,
                          const Rates& r, float mu, float beta2, const ShardSum& sum_over_shards) {
  const at::Tensor decay = r.decay_t();
  for (const at::Tensor& x : X) scale_(x, decay);
  const at::Tensor neg_lr = r.neg_adjusted_lr_t();
  for (size_t i = 0; i < X.size(); ++i) {
    at::Tensor sel = U[i].to(at::kFloat).abs().sum(-1, /*keepdim=*/true) > 0;  // [.., m, 1]
    M[i].mul_(at::where(sel, f32(mu).to(M[i].scalar_type()), at::ones({}, M[i].options())));
    auto [u_normed, v_new] = normuon_normalize(U[i], V[i].to(at::kFloat), beta2, {}, sum_over_shards);
    V[i].copy_(at::where(sel, v_new.to(V[i].scalar_type()), V[i]));
    X[i].add_(scale(u_normed, neg_lr).to(X[i].scalar_type()));
  }
}

}  // namespace dion::math
