// dion/math/dion.h — legacy Dion (arXiv 2504.05295): low-rank power iteration with error
// feedback, single-process part.
//
// For M [m, n] (transposed to [n, m] when m < n so that the Q side is the short one):
//   M += G
//   P = M Q                      [m, r]   one power-iteration step from the previous Q
//   P = orthonormalize(P)        QR in fp32 (randomized Cholesky QR when m > r)
//   R = M^T P                    [n, r]
//   M -= (1 - mu) P R^T          error feedback: keep what the rank-r update missed
//   Q = R / ||R_col||            column-normalized, becomes next step's Q
//   X = (1 - lr wd) X - lr sqrt(d_out / d_in) P Q^T
// An all-zero M gives P = 0 and keeps Q. All matrices of a batch share one shape.
#pragma once

#include <ATen/core/Tensor.h>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "dion/math/rates.h"

namespace dion::math {

// The low rank r for a [m, n] matrix: ceil(rank_fraction * min(m, n)) rounded up to
// rank_multiple_of, at most min(m, n).
int64_t dion_rank(int64_t m, int64_t n, double rank_fraction, int64_t rank_multiple_of);

// Whether Dion works on M^T for this shape (m < n).
inline bool dion_is_transposed(int64_t m, int64_t n) { return m < n; }

// Orthonormalize the columns of a batch P [B, rows, r]: QR in fp32 when rows <= r, otherwise
// randomized Cholesky QR with a Gaussian sketch of ceil(oversample * r / 128) * 128 rows drawn
// from the default generator. Returns P's dtype.
// `generator`: where the sketch comes from (default: the global generator). Sharded callers
// pass one seeded identically on every rank, so that every rank computes the same P.
at::Tensor dion_orthonormalize(const at::Tensor& P, float oversample,
                               std::optional<at::Generator> generator = std::nullopt);

// A new generator for tensors on `device`, seeded with `seed`: a CPU generator for CPU tensors,
// the device's own kind otherwise (normal_ on a CUDA tensor refuses a CPU generator). Every
// rank that passes the same seed and device kind draws the same sketch.
at::Generator dion_sketch_generator(const at::Device& device, uint64_t seed);

// Whether Dion works on M^T for a parameter sharded on `outer_dim` (FSDP; -1 none) and
// `inner_dim` (TP; -1 none): the outer-sharded dim becomes the Q side, as in the reference.
bool dion_is_transposed_sharded(int64_t m, int64_t n, int64_t outer_dim, int64_t inner_dim);

// The step in two halves, so that a distributed caller can move P and R between them.
struct DionBatch {
  at::Tensor M_batch;  // [B, m', n'] (M, or M^T when transposed)
  at::Tensor Q_batch;  // [B, n', r] in M's dtype
  at::Tensor P;        // [B, m', r] = M_batch Q_batch, before orthonormalization
  bool transposed = false;
};
// M += G; one power-iteration step P = M Q. `transposed`: -1 decides from M's shape.
DionBatch dion_power(at::TensorList G, at::TensorList M, at::TensorList Q, int transposed = -1);
// R = M^T P for the orthonormalized P.
at::Tensor dion_R(const DionBatch& b, const at::Tensor& P);
// Zero/NaN guard, error feedback M -= (1 - mu) P R^T, Q = column-normalized R, the weight update.
// `shape`: the parameter's global [m, n] (for the lr scale). When R's rows are sharded,
// `sum_columns` sums the per-column squared norms over the shards (in place).
void dion_finish(at::TensorList X, at::TensorList M, at::TensorList Q, const DionBatch& b, at::Tensor P, at::Tensor R,
                 const Rates& r, float mu, float epsilon, c10::IntArrayRef shape = {},
                 const std::function<void(at::Tensor&)>& sum_columns = nullptr);

// One Dion step for a batch of same-shape matrices. X, G, M [m, n]; Q [n, r] ([m, r] when
// transposed), updated in place.
// `r`: lr and weight decay, host or device form (dion/math/rates.h).
void dion_step(at::TensorList X, at::TensorList G, at::TensorList M, at::TensorList Q, const Rates& r, float mu,
               float epsilon, float oversample);

}  // namespace dion::math
