// tools/dion-bench/gpt_params.h — the GPT parameter sets dion-bench steps on (`step`, `dist`):
// per block q, k, v, o [d, d], up [4d, d], down [d, 4d]; per block two norm gains [d]; the
// embedding and lm_head [vocab, d]. Values and gradients drawn from the current seed.
//
// What it is not: a model (no forward), and no optimizer groups (the callers build those).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dion::bench {

struct ParamSet {
  std::vector<at::Tensor> matrices;  // 6 per block, in block order: q, k, v, o, up, down
  std::vector<at::Tensor> adamw;     // norm gains [d] (2 per block), embedding [vocab, d], final gain [d]
  std::vector<at::Tensor> lion;      // lm_head [vocab, d]
};

// The parameter set of bench/compare_reference.py (same shapes, same groups); every tensor has
// a gradient (randn * 1e-2). Matrices are scaled by 1 / sqrt(columns).
ParamSet make_params(int64_t d, int64_t layers, int64_t vocab);

// Detached copies with cloned gradients.
std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& ps);

}  // namespace dion::bench
