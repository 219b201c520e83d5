// dion/math/nordion2.h — NorDion2 (exported also as Dion3): Dion2's selection and error
// feedback along rows, with NorMuon's per-neuron normalization of the selected rows.
//
//   pre:   dion2_pre with select_dim = -2 and ef_decay = mu (mu is the EF decay here)
//   (orthogonalize the selected rows U [N, .., k, n])
//   norm:  V[selected] and U normalized as NorMuon (fp32 compute, V stored in its own dtype)
//   post:  dion2_post with the normalized U
//
// Header-only: the algorithm's whole math is here (its driver, src/optim/drivers/dion2.cpp, is
// the only file that includes it).
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <utility>

#include "dion/math/normuon.h"
#include "dion/math/rates.h"

namespace dion::math {

// U [N, .., k, n] orthogonalized selected rows; V [N, .., m, 1] full variance buffer;
// indices [N, .., k]. Returns (normalized U in fp32, updated V in V's dtype). Sharded U: the
// sums over the shards and over the column blocks as normuon_normalize takes them.
inline std::pair<at::Tensor, at::Tensor> nordion2_normalize_selected(const at::Tensor& U, const at::Tensor& V,
                                                                     const at::Tensor& indices, float beta2,
                                                                     const ShardSum& sum_over_shards = nullptr,
                                                                     const ColumnShards& column_shards = {}) {
  RECORD_USER_SCOPE("dion::nordion2_normalize");
  at::Tensor idx = indices.unsqueeze(-1);                    // [N, .., k, 1]
  at::Tensor V_sel = at::gather(V, -2, idx).to(at::kFloat);  // [N, .., k, 1]
  auto [U_normed, V_sel_new] = normuon_normalize(U, V_sel, beta2, {}, sum_over_shards, column_shards);
  at::Tensor V_new = V.scatter(-2, idx, V_sel_new.to(V.scalar_type()));
  return {U_normed, V_new};
}

// Global selection scope: U [.., m, n] is zero except on the selected rows. EF-decay those rows
// of M, normalize U as NorMuon (V updated on selected rows only), decay and update X.
// `r`: lr, weight decay and adjusted lr, host or device form (dion/math/rates.h).
inline void nordion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList V, at::TensorList U, const Rates& r,
                                 float mu, float beta2, const ShardSum& sum_over_shards = nullptr) {
  const at::Tensor decay = r.decay_t();
  for (const at::Tensor& x : X) scale_(x, decay);
  const at::Tensor neg_lr = r.neg_adjusted_lr_t();
  for (size_t i = 0; i < X.size(); ++i) {
    at::Tensor sel = U[i].to(at::kFloat).abs().sum(-1, /*keepdim=*/true) > 0;  // [.., m, 1]
    M[i].mul_(at::where(sel, at::scalar_tensor(mu, at::kFloat).to(M[i].scalar_type()), at::ones({}, M[i].options())));
    auto [u_normed, v_new] = normuon_normalize(U[i], V[i].to(at::kFloat), beta2, {}, sum_over_shards);
    V[i].copy_(at::where(sel, v_new.to(V[i].scalar_type()), V[i]));
    X[i].add_(scale(u_normed, neg_lr).to(X[i].scalar_type()));
  }
}

}  // namespace dion::math
