// dion/math/scalar.h — element-wise optimizers for embeddings, lm_head, norms and biases.
//
// adamw: multi-tensor fused AdamW (ATen's _fused_adamw_): bias correction from a per-parameter
//        step counter (0-d fp32 tensor, incremented here), decoupled weight decay; cautious
//        weight decay undoes the decay where sign(M * X) < 0. A parameter whose M or V has
//        another dtype than it (the reference's variance_dtype, e.g. bf16 under Dion's mixed
//        precision) takes the reference's unfused adamw_update instead (the fused kernel needs
//        one dtype): M = lerp(M, G, 1 - beta1); V = beta2 V + (1 - beta2) G^2;
//        X *= 1 - lr wd;  X -= lr / (1 - beta1^t) * M / (sqrt(V) / sqrt(1 - beta2^t) + eps).
// lion:  U = sign(lerp(M, G, 1 - beta1));  M = lerp(M, G, 1 - beta2);
//        X *= 1 - lr wd (or cautious);  X -= lr U
// Hyperparameters are float32, as the reference passes them as 0-d float32 tensors. Lion without
// cautious weight decay runs as one pass per tensor on contiguous float32 / bf16 CPU tensors
// (dion/math/elementwise.h), bit-identical to the ATen ops.
#pragma once

#include <ATen/core/Tensor.h>

namespace dion::math {

struct AdamWHyper {
  float lr, beta1, beta2, weight_decay, epsilon;
  bool cautious_wd = false;
  at::Tensor lr_dev = {};  // defined: lr read from this 0-d float32 tensor on the parameters' device
                           // (dion/math/rates.h); weight_decay stays a host value (a double in
                           // torch's fused kernel)
};

// X, G, M, V lists of same-length; steps: one 0-d fp32 tensor per parameter.
void adamw_update(at::TensorList X, at::TensorList G, at::TensorList M, at::TensorList V, at::TensorList steps,
                  const AdamWHyper& h);

struct LionHyper {
  float lr, beta1, beta2, weight_decay;
  bool cautious_wd = false;
  at::Tensor lr_dev = {}, weight_decay_dev = {};  // defined: read on the device (dion/math/rates.h)
};

void lion_update(at::TensorList X, at::TensorList G, at::TensorList M, const LionHyper& h);

}  // namespace dion::math
