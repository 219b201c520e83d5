// dion/train/grad_norm.h — the training step's numerics: the global gradient norm and clipping
// (docs/train.md "Gradient norm, clipping, non-finite steps").
//
//   GradNorm g = grad_norm(model->parameters(), par, grads_summed_over_dp);   // collective (world)
//   if (g.finite && clip > 0) clip_gradients(model->parameters(), g.norm, clip);
//
// grad_norm: the L2 norm of the whole model's gradient, what train.py logs with
// torch.nn.utils.get_total_norm over its (DTensor) gradients, but summed in double: the squares
// of every element of this rank's parts, in double, then summed over the ranks that hold
// DISJOINT parts (torch's fp32 norm of a large tensor is off by up to ~1e-5 relative, by a
// different amount per shard; tests/train/test_numerics.cpp measures both). Under FSDP and TP every parameter
// is split (dion/train/parallel.h: wte and lm_head included), so the (fs, tp) parts of one dp
// replica partition the model; the dp replicas hold identical copies of the summed gradient, so
// only dp rank 0's parts are counted (one all_reduce over the world of two doubles; none for one
// process). `finite` is false when any gradient element on ANY rank is NaN or +-inf (the second
// double sums every rank's squares), so every rank takes the same decision.
// grads_summed_over_dp false (legacy Dion's replicate_mesh_grad_sync, dp > 1): the dp gradient
// sum is never formed; `norm` is then what train.py logs in that mode: dp rank 0's own gradient
// (its fs x tp parts), in the reference's scale (the trainer divides the loss by dp as well: x dp).
//
// clip_gradients: torch.nn.utils.clip_grad_norm_'s rule: when norm > max_norm every gradient is
// multiplied by max_norm / (norm + 1e-6) (computed in double, applied as the fp32 multiplier);
// otherwise nothing is touched. Returns the multiplier (1 when not clipped).
//
// Not here: the decision to skip a step and the N-in-a-row stop (Trainer::update_or_skip,
// trainer.h); the tests' NaN (DION_TEST_NONFINITE: TrainHooks::after_backward, installed by
// tools/dion-train/test_hooks.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dion::train {

class Parallel;  // dion/train/parallel.h

struct GradNorm {
  double norm = 0;     // the global L2 norm (NaN / inf when not finite)
  bool finite = true;  // every gradient element on every rank is finite
};

GradNorm grad_norm(const std::vector<at::Tensor>& params, Parallel& par, bool grads_summed_over_dp);
double clip_gradients(const std::vector<at::Tensor>& params, double norm, double max_norm);

}  // namespace dion::train
