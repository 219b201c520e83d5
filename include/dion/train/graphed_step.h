// dion/train/graphed_step.h — dion-train's training step, eager or in CUDA graphs (config key
// cuda_graphs).
//
//   MicroStep step(model, opt, device, autocast, loss_scale, graphs);
//   per micro-batch: at::Tensor loss = step.forward_backward(x, y);   // loss detached
//   then:            step.optimizer_step();                           // step + zero the grads
//   or:              step.discard_gradients();                        // zero the grads, no step
//
// Eager (graphs false): autocast forward, (loss * loss_scale).backward(), opt.step(),
// zero_grad(set_to_none) — the loop train.py runs.
// Graphs (true, CUDA only): the first training step runs eagerly (the optimizer's state, cuBLAS
// workspaces, the rotary tables are created outside any capture), on a side stream the whole run
// uses (capture needs a non-default stream). At the first micro-batch after it, forward +
// backward is captured once with fixed shapes: x and y are copied into static input buffers,
// the replay accumulates into the same .grad tensors (zeroed in place, not set to none), the loss
// lands in a static tensor. The optimizer step is replayed by dion::CudaGraphStep
// (dion/optim/cuda_graph.h): lr and weight decay are read from device tensors, so the schedule
// works under replay. The model has no dropout, so there is no RNG in the forward; legacy Dion's
// sketch draws from the default CUDA generator, which a capture registers (graph-safe philox).
// What cannot be captured is refused before the run by config_validate (device cpu, more than
// one process) or by the capture itself with dion::ValueError naming it.
// Not here: validation (eager), the lr schedule, timing (train.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "dion/optim/optimizer.h"
#include "dion/train/gpt.h"

namespace dion::train {

class MicroStep {
 public:
  // loss_scale: what each micro-batch's loss is multiplied by before backward (1 / the global
  // micro-batch count). graphs: capture (throws ConfigError when not CUDA / built without CUDA).
  MicroStep(GPT& model, dion::Optimizer& opt, const at::Device& device, bool autocast, double loss_scale, bool graphs);
  ~MicroStep();
  MicroStep(const MicroStep&) = delete;
  MicroStep& operator=(const MicroStep&) = delete;

  // One micro-batch: x, y [B, T] token ids (any device). Returns the loss (0-d fp32, detached;
  // under graphs a static tensor overwritten by the next call).
  at::Tensor forward_backward(const at::Tensor& x, const at::Tensor& y);
  void optimizer_step();
  // Zero the gradients as optimizer_step does, without stepping (nothing else changes; the
  // CUDA-graph warm-up still waits for the first real step).
  void discard_gradients();

  bool graphs() const;
  bool captured() const;    // the forward + backward graph exists
  int64_t replays() const;  // forward + backward replays (the capture's own included)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dion::train
