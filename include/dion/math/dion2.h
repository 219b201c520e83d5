// dion/math/dion2.h — Dion2's per-step math: submatrix selection with error feedback.
//
//   pre:   M += G
//          pick k = max(1, ceil(fraction * n_select)) slices of M along select_dim (rows when
//          select_dim = -2, columns when -1) with the largest L1 norms
//          U = M[selected] (-> comm dtype);  M[selected] *= ef_decay   (error feedback)
//   (orthogonalize U [.., k, n] or [.., m, k])
//   post:  X *= 1 - lr * wd;  X[selected] -= adjusted_lr * U
//
// select_dim defaults to the shorter matrix dim (rows when m <= n). Its normalized variant
// uses the same selection with ef_decay = mu along rows. On contiguous float32 / bf16 CPU matrices, pre and post
// run as fused passes (dion/math/elementwise.h), bit-identical to the ATen ops; pre then returns
// U as consecutive slices of one [N, k, n] buffer. Shapes: M [.., m, n]; indices [.., k] (int64).
#pragma once

#include <ATen/core/Tensor.h>

#include "dion/math/ortho.h"
#include "dion/math/rates.h"

#include <functional>
#include <utility>
#include <vector>

namespace dion::math {

struct Selection {
  std::vector<at::Tensor> U;        // selected slices, comm dtype: [.., k, n] or [.., m, k]
  std::vector<at::Tensor> indices;  // per parameter [.., k], int64
};

// k for `fraction` of `n_select` slices: max(1, ceil(fraction * n_select)).
int64_t dion2_num_selected(double fraction, int64_t n_select);

// Which dim to select along when the parameter is not sharded: the shorter one (-2 on ties).
int64_t dion2_select_dim(int64_t rows, int64_t cols);

// Momentum accumulation, top-k selection, error-feedback decay. `k_override` > 0 forces k
// (the sharded "local" scope), clamped to the available count. `sum_norms`: when each slice
// along select_dim is split across ranks (a matrix sharded along the other dim), adds the other
// ranks' partial L1 norms [N, .., n_select] in place; every rank must get the same sums, so that
// all select the same slices (each keeps its part of them).
Selection dion2_pre(at::TensorList G, at::TensorList M, double fraction, float ef_decay, int64_t select_dim,
                    at::ScalarType comm_dtype, int64_t k_override = 0,
                    const std::function<void(at::Tensor&)>& sum_norms = nullptr);

// The same selection when the slices were chosen elsewhere (the whole-matrix top-k of a matrix
// sharded along select_dim, decided across the shards): U_i = M_i[indices_i] along select_dim
// (M's dtype), then the error feedback M_i[indices_i] *= ef_decay. indices_i: [c_i] int64, 1-D
// (c_i may differ between the matrices); M_i [m, n].
std::vector<at::Tensor> dion2_take_selected(at::TensorList M, at::TensorList indices, float ef_decay,
                                            int64_t select_dim);

// Weight decay on all of X, then the update on the selected slices only. U is cast to X's
// dtype before scaling (as the reference does).
// `r`: lr, weight decay and adjusted lr, host or device form (dion/math/rates.h).
void dion2_post(at::TensorList X, at::TensorList U, at::TensorList indices, const Rates& r, int64_t select_dim);
inline void dion2_post(at::TensorList X, at::TensorList U, at::TensorList indices, float lr, float adjusted_lr,
                       float weight_decay, int64_t select_dim) {
  dion2_post(X, U, indices, Rates::host(lr, weight_decay).with_adjusted_lr(adjusted_lr), select_dim);
}

}  // namespace dion::math

namespace dion::math {

// ---------------------------------------------------------------------------- global selection
// Used when a row- or column-sharded matrix is assembled whole before selection ("global"
// selection scope): the top-k is exact and independent of the sharding.

// M += G; returns M (whole shard) in comm_dtype. Error feedback is deferred to the masked post.
std::vector<at::Tensor> dion2_accumulate(at::TensorList G, at::TensorList M, at::ScalarType comm_dtype);

// Wrap an orthogonalizer: select the top-k slices of each assembled matrix X [.., m, n] by L1
// norm along select_dim (k from `global_select_size`, the true unpadded size), orthogonalize the
// submatrix, scatter it into an otherwise-zero tensor of X's shape.
OrthoFn dion2_select_then(OrthoFn orthogonalize, double fraction, int64_t select_dim, int64_t global_select_size);

// The selected slices are the nonzero ones of U: EF-decay them in M, decay X, update X.
void dion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList U, const Rates& r, float ef_decay,
                       int64_t select_dim);
inline void dion2_post_masked(at::TensorList X, at::TensorList M, at::TensorList U, float lr, float adjusted_lr,
                              float weight_decay, float ef_decay, int64_t select_dim) {
  dion2_post_masked(X, M, U, Rates::host(lr, weight_decay).with_adjusted_lr(adjusted_lr), ef_decay, select_dim);
}

}  // namespace dion::math
