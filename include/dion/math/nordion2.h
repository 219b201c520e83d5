// dion/math/nordion2.h — NorDion2 (exported also as Dion3): Dion2's selection and error
// feedback along rows, with NorMuon's per-neuron normalization of the selected rows.
//
//   pre:   dion2_pre with select_dim = -2 and ef_decay = mu (mu is the EF decay here)
//   (orthogonalize the selected rows U [N, .., k, n])
//   norm:  V[selected] and U normalized as NorMuon (fp32 compute, V stored in its own dtype)
//   post:  dion2_post with the normalized U
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "dion/math/normuon.h"
#include "dion/math/rates.h"

namespace dion::math {

// U [N, .., k, n] orthogonalized selected rows; V [N, .., m, 1] full variance buffer;
// indices [N, .., k]. Returns (normalized U in fp32, updated V in V's dtype). Sharded U: the
// sums over the shards and over the column blocks as normuon_normalize takes them.
std::pair<at::Tensor, at::Tensor> nordion2_normalize_selected(const at::Tensor& U,
                                                              const at::Tensor& V,
                                                              const at::Tensor& indices,
                                                              float beta2,
                                                              const ShardSum& sum_over_shards = nullptr,
                                                              const ColumnShards& column_shards = {});

// Global selection scope: U [.., m, n] is zero except on the selected rows. EF-decay those rows
// of M, normalize U as NorMuon (V updated on selected rows only), decay and update X.
// `r`: lr, weight decay and adjusted lr, host or device form (dion/math/rates.h).
void nordion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList V, at::TensorList U,
                          const Rates& r, float mu, float beta2, const ShardSum& sum_over_shards = nullptr);

}  // namespace dion::math
