// AdamW and Lion (see include/dion/math/scalar.h).
#include "dion/math/scalar.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <vector>

#include "dion/math/elementwise.h"
#include "dion/math/muon.h"
#include "dion/math/rates.h"
#include "scalar_tensor.h"

namespace dion::math {

namespace {

// The reference's adamw_update (dion/scalar_opts.py) for one parameter whose M or V is in another
// dtype than X: each op in the state's dtype, as there. `step` already incremented.
void adamw_unfused(const at::Tensor& X, const at::Tensor& G, const at::Tensor& M, const at::Tensor& V,
                   const at::Tensor& step, const AdamWHyper& h) {
  const at::Tensor lr = h.lr_dev.defined() ? h.lr_dev : f32(h.lr);
  M.lerp_(G.to(M.scalar_type()), f32(1.0f - h.beta1));
  V.mul_(f32(h.beta2)).addcmul_(G, G, 1.0 - double(h.beta2));
  const at::Tensor bc1 = 1 - at::pow(f32(h.beta1), step);
  const at::Tensor bc2_sqrt = (1 - at::pow(f32(h.beta2), step)).sqrt();
  const at::Tensor denom = V.sqrt().div_(bc2_sqrt).add_(double(h.epsilon));
  if (h.cautious_wd && h.weight_decay > 0.0f) {
    const at::Tensor mask = (M / denom * X >= 0).to(X.scalar_type());
    X.sub_(X * mask * (lr * f32(h.weight_decay)));
  } else {
    X.mul_(1 - lr * f32(h.weight_decay));
  }
  X.sub_(M.to(X.scalar_type()) / denom.to(X.scalar_type()) * (lr / bc1));
}

}  // namespace

void adamw_update(at::TensorList X, at::TensorList G, at::TensorList M, at::TensorList V, at::TensorList steps,
                  const AdamWHyper& h) {
  RECORD_USER_SCOPE("dion::adamw");
  if (X.empty()) return;
  bool one_dtype = true;
  for (size_t i = 0; i < X.size(); ++i)
    one_dtype = one_dtype && M[i].scalar_type() == X[i].scalar_type() && V[i].scalar_type() == X[i].scalar_type();
  if (!one_dtype) {
    at::_foreach_add_(steps, 1);
    for (size_t i = 0; i < X.size(); ++i) adamw_unfused(X[i], G[i], M[i], V[i], steps[i], h);
    return;
  }
  std::vector<at::Tensor> X_orig;
  const bool cwd = h.cautious_wd && h.weight_decay > 0.0f;
  if (cwd) {
    for (const at::Tensor& x : X) X_orig.push_back(x.clone());
  }
  at::_foreach_add_(steps, 1);
  if (h.lr_dev.defined()) {  // lr read on the device (the kernel widens the float32 value to double)
    at::_fused_adamw_(X, G, M, V, /*max_exp_avg_sqs=*/{}, steps, h.lr_dev, static_cast<double>(h.beta1),
                      static_cast<double>(h.beta2), static_cast<double>(h.weight_decay), static_cast<double>(h.epsilon),
                      /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adamw_(X, G, M, V, /*max_exp_avg_sqs=*/{}, steps, static_cast<double>(h.lr),
                      static_cast<double>(h.beta1), static_cast<double>(h.beta2), static_cast<double>(h.weight_decay),
                      static_cast<double>(h.epsilon),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  if (cwd) {
    // The fused kernel decayed everywhere; add back lr * wd * X where momentum and the
    // original parameter disagree in sign.
    const at::Tensor coeff = h.lr_dev.defined() ? h.lr_dev * f32(h.weight_decay) : f32(h.lr * h.weight_decay);
    for (size_t i = 0; i < X.size(); ++i) {
      at::Tensor undo = (M[i] * X_orig[i] < 0).to(X_orig[i].scalar_type());
      X[i].add_(scale(X_orig[i] * undo, coeff));
    }
  }
}

void lion_update(at::TensorList X, at::TensorList G, at::TensorList M, const LionHyper& h) {
  RECORD_USER_SCOPE("dion::lion");
  bool fused = !h.cautious_wd && !h.lr_dev.defined();  // host values only
  for (size_t i = 0; fused && i < X.size(); ++i) fused = cpu::cpu_fusable(X[i], G[i], M[i]);
  if (fused) {
    // One pass per tensor, bit-identical to the ops below (dion/math/elementwise.h).
    for (size_t i = 0; i < X.size(); ++i) cpu::lion_(X[i], G[i], M[i], h.lr, h.beta1, h.beta2, h.weight_decay);
    return;
  }
  std::vector<at::Tensor> U;
  U.reserve(X.size());
  for (size_t i = 0; i < X.size(); ++i) {
    at::Tensor g = G[i].to(M[i].scalar_type());
    U.push_back(at::lerp(M[i], g, f32(1.0f - h.beta1)).sign_());
    M[i].lerp_(g, f32(1.0f - h.beta2));
  }
  const Rates r = h.lr_dev.defined() ? Rates::device(h.lr_dev, h.weight_decay_dev, h.lr, h.weight_decay)
                                     : Rates::host(h.lr, h.weight_decay);
  apply_weight_decay(X, U, r, h.cautious_wd);
  const at::Tensor lr = r.lr_t();
  for (size_t i = 0; i < X.size(); ++i) {
    scale_(U[i], lr);
    X[i].sub_(U[i]);
  }
}

}  // namespace dion::math
