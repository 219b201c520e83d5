// dion/math/muon.h — Muon's per-step math, split around the orthogonalization.
//
//   pre:   M = mu * M + G;  U = nesterov ? mu * M + G : M;  U -> comm dtype
//   (orthogonalize U: dion/math/ortho.h, on whole matrices, possibly on another rank)
//   post:  X *= 1 - lr * wd            (or cautious: only where sign(X * U) >= 0)
//          X -= adjusted_lr * U
//
// Functions over lists of same-shape local tensors; no layouts, no communication. NorMuon and the
// row-selecting normalized variant reuse `post`. On contiguous float32/bf16 tensors, `pre` and `post` (without
// cautious weight decay) run as one fused kernel each, bit-identical to the ATen ops they
// replace: dion/cuda/fused.h on CUDA, dion/math/elementwise.h on the CPU; otherwise those ATen
// ops. `pre` writes the N matrices of a megabatch into one [N, ..., m, n] buffer (U[i] are its
// consecutive slices), so stack_megabatch (dion/math/ortho.h) views it without a copy.
// Shapes: X, G, M [..., m, n] each; U the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "dion/math/rates.h"

namespace dion::math {

// Momentum update; returns the matrices to orthogonalize, in `comm_dtype`.
std::vector<at::Tensor> muon_pre(at::TensorList G, at::TensorList M, float mu, bool nesterov,
                                 at::ScalarType comm_dtype);

// Weight decay (plain or cautious) and the update. U may be any float dtype; the product
// adjusted_lr * U is formed in U's dtype, as the reference does. `r`: lr, weight decay and the
// adjust factor, host or device form (dion/math/rates.h).
void muon_post(at::TensorList X, at::TensorList U, const Rates& r, bool cautious_wd);
inline void muon_post(at::TensorList X, at::TensorList U, float lr, float adjusted_lr, float weight_decay,
                      bool cautious_wd) {
  muon_post(X, U, Rates::host(lr, weight_decay).with_adjusted_lr(adjusted_lr), cautious_wd);
}

// X *= 1 - lr * wd, or the cautious variant: decay only where sign(X * U) >= 0
// (arXiv 2510.12402). Shared by Muon, NorMuon and Lion.
void apply_weight_decay(at::TensorList X, at::TensorList U, const Rates& r, bool cautious_wd);

}  // namespace dion::math
