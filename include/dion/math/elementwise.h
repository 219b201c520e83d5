// dion/math/elementwise.h — fused element-wise CPU kernels for the optimizers' pre and post steps:
// momentum and accumulation of the optimizer state, selection of slices with error-feedback
// decay, and weight updates (plain, on selected slices, sign of an interpolated momentum, and
// with per-row variance normalization).
//
// What it is: one pass over memory for an update that ATen runs as 3-6 kernels with temporaries,
// each kernel reproducing the per-element arithmetic of the ATen composition it replaces: the
// same operations in the same order, every intermediate rounded to the dtype its ATen op's
// result has (float32 or bfloat16, round to nearest even), no FMA contraction where ATen does
// not contract (the library is built with -ffp-contract=off; lerp uses an FMA exactly when
// ATen's dispatched CPU kernels do: capability AVX2 / AVX512, not DEFAULT). So they are
// bit-identical to the ATen ops on the same machine and serve the exact path too
// (tests/math/test_elementwise.cpp compares every kernel bitwise with its composition, under the
// machine's own ATen kernels and under ATEN_CPU_CAPABILITY=default).
//
// What it is not: no GPU code (dion/cuda/fused.h has the CUDA kernels of the momentum and
// update steps), no reductions whose order ATen does not fix (mean, Frobenius norms) outside
// the FAST-path kernel at the end, no cautious weight decay. Callers check cpu_fusable() and
// fall back to the ATen ops otherwise.
//
// Sources: src/math/elementwise.cpp (the switch and the checks), elementwise_state.cpp (the
// state's momentum, accumulation and selection), elementwise_update.cpp (the weight updates).
//
// Shapes: every tensor contiguous, float32 or bfloat16, on the CPU. X, G, M, U [m, n] (or any
// shape of the same number of elements) unless stated; k selected slices; idx [k] int64.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dion::math::cpu {

// False when the environment sets DION_DISABLE_FUSED (to anything but "" or "0"): every caller
// then takes its ATen composition, the state before these kernels (a measurement switch:
// `DION_DISABLE_FUSED=1 dion-bench step --phases`, docs/benchmarks.md). Read once.
bool fused_kernels_enabled();

// Every tensor defined, on the CPU, contiguous, float32 or bfloat16, of A's number of elements
// (and fused_kernels_enabled()).
bool cpu_fusable(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C = at::Tensor());

// ---- the optimizer state (elementwise_state.cpp)

// Momentum: g = G.to(M's dtype); M.mul_(mu).add_(g); when U is defined,
// U = (nesterov ? M * mu + g : M).to(U's dtype).
void momentum_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& U, float mu, bool nesterov);

// Accumulation and slice norms in one pass: M.add_(G.to(M's dtype)), then
// norms = linalg_vector_norm(M, 1, norm_dim) for the slices along select_dim (-2: rows, the L1
// norm of each row; -1: columns), summed in float in ATen's order (serial along the slice; ATen
// reduces an L1 norm with its generic serial kernel) and rounded to norms' dtype.
// M, G [m, n]; norms [n_select] contiguous, M's dtype.
void accumulate_l1_norms_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& norms, int64_t select_dim);

// Selection with error-feedback decay, for one matrix: U = M[idx] along select_dim, in U's
// dtype; then M[idx] *= ef_decay (rounded to M's dtype), as gather / scatter_ do.
// M [m, n]; idx [k] distinct; U [k, n] (select_dim -2) or [m, k] (-1).
void take_selected_(const at::Tensor& M, const at::Tensor& idx, const at::Tensor& U, float ef_decay,
                    int64_t select_dim);

// Accumulation M.add_(G) (computed in float, rounded to M's dtype: G is not cast first) with
// the new M also written to `out` (M's dtype), as it is ([m, n]) or transposed ([n, m]): the
// accumulation and the copy into a stacked batch in one pass. M, G [m, n].
void add_and_copy_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& out, bool transpose);

// ---- the weights (elementwise_update.cpp)

// X.mul_(decay); X.add_(step) with step = (U * neg_lr) in U's dtype (step_in_x_dtype false:
// X.sub_(U * adjusted_lr)), or U.to(X's dtype) * neg_lr in X's dtype (true: the update cast to
// X's dtype before it is scaled, as the selected variant below adds it with scatter_add_).
void decay_and_update_(const at::Tensor& X, const at::Tensor& U, float decay, float neg_lr, bool step_in_x_dtype);

// The same on selected slices, for one matrix: X.mul_(decay); X[idx] += U.to(X's dtype) * neg_lr
// along select_dim (scatter_add_). X [m, n]; idx [k] distinct; U [k, n] or [m, k].
void decay_and_update_selected_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& idx, float decay,
                                float neg_lr, int64_t select_dim);

// The step along the sign of an interpolated momentum, without cautious weight decay, as its
// ATen composition:
//   g = G.to(M's dtype); U = lerp(M, g, 1 - beta1).sign_(); M.lerp_(g, 1 - beta2);
//   X.mul_(1 - lr wd); X.sub_(U.mul_(lr))
void lion_(const at::Tensor& X, const at::Tensor& G, const at::Tensor& M, float lr, float beta1, float beta2,
           float weight_decay);

// ---- the orthogonalizers' polynomial steps (elementwise_update.cpp)

// Y = X * a + Y * b (scale_y) or X * a + Y (not), in place into Y: the exact Newton-Schulz /
// Polar Express step's `A * b + (A @ A) * c` and `X * a + B @ X` with the product's temporary as
// Y; each product rounded to the dtype, then the sum, as those ATen compositions. X, Y of one
// dtype, contiguous, the same number of elements.
void scaled_add_(const at::Tensor& X, float a, const at::Tensor& Y, float b, bool scale_y);

// ---- FAST path only (not bit-identical: float sums in another order than ATen's mean / norm)

// Per-row (per-neuron) variance normalization fused with the update, for one matrix, in two
// passes over U instead of the ~10 of the ATen composition (the normalization, then the
// update step):
//   s_r = sum_j U_rj^2;  V[p_r] = lerp(V[p_r], s_r / n, 1 - beta2);  d_r = sqrt(V[p_r]) + 1e-8
//   f = ||U||_F / max(||U / d||_F, 1e-8);  X *= decay;  X[p_r] += (U_r f / d_r) * neg_lr
// p_r = idx[r] (U holds selected rows of X) or r when idx is undefined (U holds every row:
// k = m). Row sums in 16 float lanes, totals in double; the result differs from the
// composition by float32 rounding (tests/test_elementwise).
// X [m, n] float32 / bf16; U [k, n] float32 / bf16; V [m, 1] float32 / bf16; idx [k] int64.
void normuon_update_(const at::Tensor& X, const at::Tensor& U, const at::Tensor& V, const at::Tensor& idx, float beta2,
                     float decay, float neg_lr);

}  // namespace dion::math::cpu
