// dion/optim/cuda_graph.h — an optimizer's step() captured in a CUDA graph once, replayed after.
//
//   dion::CudaGraphStep graphed(opt);       // opt: any torch::optim::Optimizer on CUDA params
//   for (...) { loss.backward(); graphed.step(); }   // grads written into the same tensors
//
// The first `warmup_steps` calls run opt.step() eagerly (state is created lazily there), the
// next one captures the step on a side stream and replays it once, every later call replays it:
// one graph launch instead of the step's hundreds of kernel launches and host-side work. It uses
// the Optimizer's public API only (param_groups(), state(), step()).
//
// What a replay cannot do, and is refused with dion::ValueError naming it, before anything runs:
//   - capture with a parameter that has no gradient (its update would be baked out), or not on
//     one CUDA device; an optimizer distributed over more than one process (at construction);
//   - a replay after the parameter set changed (add_param_group, other tensors), a gradient
//     tensor was replaced (zero_grad with set_to_none: write gradients into the same tensors),
//     or the optimizer's state was replaced (load_state_dict);
//   - a replay after a hyperparameter changed that the graph holds as captured. A dion::Optimizer
//     is switched to device scalars (Optimizer::set_device_scalars): each group's lr and weight
//     decay live in 0-d float32 tensors on the device, filled from the groups' values before
//     every replay, so an lr schedule (or a weight-decay one) works under replay. Still refused:
//     weight_decay of an "adamw" group (torch's fused AdamW takes it on the host) and every other
//     hyperparameter (mu, betas, ...); with any other optimizer, lr too. Call reset() after such a
//     change (the next step() captures again, at the cost of one capture).
//   - a step that synchronizes with the host (a .item(), e.g. Dion2's distributed selection): the
//     capture fails and the error says so.
// The groups' host step counters (dion::Options::step) are advanced on each replay, so that
// state_dict() stays right. Without CUDA (a build or a machine), the constructor throws.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>

namespace dion {

class CudaGraphStep {
 public:
  explicit CudaGraphStep(torch::optim::Optimizer& optimizer, int warmup_steps = 1);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  void step();   // eager (warm-up), capture + replay, or replay
  void reset();  // drop the graph: the next step() captures again
  bool captured() const;
  int64_t replays() const;  // replays since the capture (the capture's own one included)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dion
