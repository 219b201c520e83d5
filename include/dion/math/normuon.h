// dion/math/normuon.h — NorMuon's per-neuron normalization (arXiv 2510.05491).
//
// After Muon's orthogonalization U [N, .., m, n]:
//   V = lerp(V, mean_j U_ij^2, 1 - beta2)          per-neuron (row) second moment, V [N, .., m, 1]
//   U' = U / (sqrt(V) + 1e-8)
//   U' *= ||U||_F / max(||U'||_F, 1e-8)            keep the update's Frobenius norm
// Computed in V's dtype. With split_sizes, each row block is normalized on its own.
// When U holds shards of larger matrices, `sum_over_shards` sums the per-matrix squared
// Frobenius norms across the shards (in place), so the rescale uses the whole matrix's norm.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

namespace dion::math {

// Returns (U', V'). U [N, .., m, n] any float dtype; V [N, .., m, 1].
using ShardSum = std::function<void(at::Tensor&)>;

// When U's columns are split across ranks (sharded along the last dim, or 2-D sharding), the
// per-neuron mean of U^2 is a sum over all column blocks: `sum_over_columns` sums it across them
// and `columns` is the whole row length.
struct ColumnShards {
  ShardSum sum_over_columns;
  int64_t columns = 0;
};

std::pair<at::Tensor, at::Tensor> normuon_normalize(const at::Tensor& U, const at::Tensor& V, float beta2,
                                                    const std::vector<int64_t>& split_sizes = {},
                                                    const ShardSum& sum_over_shards = nullptr,
                                                    const ColumnShards& column_shards = {});

// FAST path only: the normalization fused with the update (dion/math/elementwise.h,
// cpu::normuon_update_): for every matrix i (and every head, when X[i] is [H, hd, n]),
// V[i] and U = O[i] normalized as above, then X[i] *= 1 - lr wd and X[i][rows] -= adjusted_lr U,
// where rows are indices[i] (the selected rows of the row-selecting variant; O[i] [.., k, n]) or all rows (indices
// empty: NorMuon). Differs from normuon_normalize + muon_post / dion2_post by float32 rounding.
// Local matrices only (no shard sums, no split_sizes, no cautious weight decay: the caller
// checks). Returns false, having changed nothing, when a tensor is not a contiguous float32 /
// bf16 CPU tensor.
bool normuon_update_fast(at::TensorList X, const at::Tensor& O, at::TensorList V, at::TensorList indices, float beta2,
                         float lr, float adjusted_lr, float weight_decay);

}  // namespace dion::math
