// dion/math/rates.h — a step's learning rate and weight decay, as the math reads them.
//
// Two forms of the same values:
//   host (the default): float values. The math hands them to the kernels as 0-d float32 CPU
//     tensors (as the reference does), i.e. as kernel arguments: a captured CUDA graph keeps the
//     values it was captured with.
//   device: lr_dev / weight_decay_dev, 0-d float32 tensors on the parameters' device that the
//     optimizer fills before each step (dion::Optimizer::set_device_scalars). The math derives
//     adjusted_lr, 1 - lr wd, ... from them with tensor ops on that device, so a captured graph
//     reads the values current at each replay: an lr schedule works under CUDA-graph replay.
// Both give the same bits: every derived value is one float32 operation either way (C++ floats
// here are compiled with -ffp-contract=off), and scale() / scale_() multiply as ATen multiplies
// a tensor by a CPU float32 scalar (the product rounded once to the tensor's dtype) whichever
// device the scalar is on. tests/optim/test_device_scalars.cpp (DeviceScalars.*) pins this on CPU;
// tests/cuda/test_cuda.cpp on a GPU.
//
// Not here: the hyperparameters that stay host values (mu, betas, epsilon, ...; the weight decay
// of the per-element adaptive update, which torch's fused kernel for it takes as a double).
#pragma once

#include <ATen/core/Tensor.h>

namespace dion::math {

struct Rates {
  float lr = 0, weight_decay = 0;
  float adjust_factor = 1;              // adjusted_lr = lr * adjust_factor, in float32
  float adjusted_lr = 0;                // its host value
  at::Tensor lr_dev, weight_decay_dev;  // device form: 0-d float32 (undefined: host form)

  // The host form, adjust_factor 1 (adjusted_lr = lr).
  static Rates host(float lr, float weight_decay);
  // The device form: lr / weight_decay 0-d float32 tensors on the parameters' device; lr and
  // weight_decay their host values (kept for host-only uses).
  static Rates device(at::Tensor lr_dev, at::Tensor weight_decay_dev, float lr, float weight_decay);

  bool on_device() const { return lr_dev.defined(); }
  Rates adjusted(float factor) const;               // adjust_factor = factor, adjusted_lr = lr * factor
  Rates with_adjusted_lr(float adjusted_lr) const;  // host form only: an adjusted lr given as is

  float decay() const { return 1.0f - lr * weight_decay; }

  // 0-d float32 tensors: on the device in the device form, CPU scalars in the host form. Read
  // them only (lr_t() may be lr_dev itself).
  at::Tensor lr_t() const;
  at::Tensor adjusted_lr_t() const;      // lr * adjust_factor
  at::Tensor neg_adjusted_lr_t() const;  // -(lr * adjust_factor)
  at::Tensor lr_wd_t() const;            // lr * weight_decay
  at::Tensor decay_t() const;            // 1 - lr * weight_decay
};

// t * s for a 0-d float32 tensor s, computed in float32 and rounded once to t's dtype — what
// ATen does for a CPU scalar s. (For a device s, ATen's CUDA kernels would first round s to
// t's dtype when t is bf16 / fp16: 1 - 1e-4 becomes 1, so the product is formed in float32 here.)
at::Tensor scale(const at::Tensor& t, const at::Tensor& s);
// t *= s, as scale().
void scale_(const at::Tensor& t, const at::Tensor& s);

}  // namespace dion::math
