// dion/math/ortho.h — orthogonalization of (batches of) matrices.
//
// What it is: the two polynomial iterations the reference optimizers use to approximate the
// polar factor U V^T of M = U S V^T, batched over every leading dimension:
//   - newton_schulz: the quintic Newton-Schulz iteration with Muon's five coefficient triples;
//   - polar_express: Polar Express (Amsel et al. 2025), the reference's default, with its five
//     per-step coefficient triples and the 1.02 safety factor.
// Both normalize by the Frobenius norm first (so the spectral norm is <= 1), work on the
// smaller Gram matrix (X X^T for wide, X^T X for tall inputs), and return the compute dtype.
// An all-zero matrix maps to all zeros (epsilon keeps the division finite).
//
// What it is not: no momentum, no learning rate, no communication. The optimizers call these
// through an OrthoFn so that a user-supplied orthogonalizer can replace them.
//
// Shapes: G [..., m, n] -> U [..., m, n]. Leading dims are a batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

namespace dion::math {

// A user-supplied orthogonalizer: X [..., m, n] (compute dtype) -> U [..., m, n].
// epsilon is the group's epsilon. It must be batched over leading dims.
using OrthoFn = std::function<at::Tensor(const at::Tensor& X, double epsilon)>;

enum class OrthoMethod { POLAR_EXPRESS, NEWTON_SCHULZ };

// "polar_express" | "newton_schulz"; throws std::invalid_argument naming the valid values.
OrthoMethod ortho_method_from_string(const std::string& name);
std::string to_string(OrthoMethod method);

// Quintic Newton-Schulz, 5 steps with the reference's per-step coefficients.
// Computes in `dtype` (the reference uses bf16).
at::Tensor newton_schulz(const at::Tensor& G, double epsilon = 1e-7,
                         at::ScalarType dtype = at::kBFloat16);

// Polar Express, 5 steps, safety factor 1.02 folded into the normalization.
at::Tensor polar_express(const at::Tensor& G, double epsilon = 1e-6,
                         at::ScalarType dtype = at::kBFloat16);

// Which orthogonalizer an optimizer uses. `custom`, when set, wins over `method`.
struct OrthoConfig {
  OrthoMethod method = OrthoMethod::POLAR_EXPRESS;
  at::ScalarType dtype = at::kBFloat16;  // compute (and communication) dtype
  OrthoFn custom;                        // optional user-supplied orthogonalizer

  OrthoFn function() const;               // the callable the optimizers use
};

// Orthogonalize a stacked megabatch X [N, *param_shape] the way the reference's
// muon_update_newton_schulz does, but with flatten applied per matrix:
//   flatten && param ndim >= 3: each [out, ...] becomes [out, prod(...)];
//   !flatten && param ndim >= 3: leading dims are a batch;
//   split_sizes: row blocks of dim -2 orthogonalized independently, each rescaled by
//   split_scales[i] (per-block learning-rate correction) when given.
at::Tensor orthogonalize_megabatch(const at::Tensor& X, const OrthoFn& fn, bool flatten,
                                   double epsilon,
                                   const std::vector<int64_t>& split_sizes = {},
                                   const std::vector<double>& split_scales = {});

}  // namespace dion::math
