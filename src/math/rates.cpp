// A step's learning rate and weight decay in host or device form (see include/dion/math/rates.h).
#include "dion/math/rates.h"

#include <ATen/ATen.h>

namespace dion::math {

namespace {
at::Tensor f32(float v) { return at::scalar_tensor(v, at::kFloat); }
bool reduced(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }
}  // namespace

Rates Rates::host(float lr, float weight_decay) {
  Rates r;
  r.lr = lr;
  r.weight_decay = weight_decay;
  r.adjusted_lr = lr;
  return r;
}

Rates Rates::device(at::Tensor lr_dev, at::Tensor weight_decay_dev, float lr, float weight_decay) {
  TORCH_CHECK(lr_dev.defined() && weight_decay_dev.defined() && lr_dev.dim() == 0 && weight_decay_dev.dim() == 0 &&
                  lr_dev.scalar_type() == at::kFloat && weight_decay_dev.scalar_type() == at::kFloat,
              "Rates::device: lr and weight_decay must be 0-d float32 tensors");
  Rates r = host(lr, weight_decay);
  r.lr_dev = std::move(lr_dev);
  r.weight_decay_dev = std::move(weight_decay_dev);
  return r;
}

Rates Rates::adjusted(float factor) const {
  Rates r = *this;
  r.adjust_factor = factor;
  r.adjusted_lr = lr * factor;
  return r;
}

Rates Rates::with_adjusted_lr(float adjusted) const {
  TORCH_CHECK(!on_device(), "Rates::with_adjusted_lr: the device form derives adjusted_lr from lr_dev");
  Rates r = *this;
  r.adjusted_lr = adjusted;
  return r;
}

at::Tensor Rates::lr_t() const { return on_device() ? lr_dev : f32(lr); }

at::Tensor Rates::adjusted_lr_t() const {
  if (!on_device()) return f32(adjusted_lr);
  return adjust_factor == 1.0f ? lr_dev : lr_dev * f32(adjust_factor);  // one float32 multiply
}

at::Tensor Rates::neg_adjusted_lr_t() const {
  return on_device() ? at::neg(adjusted_lr_t()) : f32(-adjusted_lr);  // negation is exact
}

at::Tensor Rates::lr_wd_t() const { return on_device() ? lr_dev * weight_decay_dev : f32(lr * weight_decay); }

at::Tensor Rates::decay_t() const {
  return on_device() ? at::rsub(lr_dev * weight_decay_dev, 1.0) : f32(decay());  // 1 - (lr wd), float32
}

at::Tensor scale(const at::Tensor& t, const at::Tensor& s) {
  if (s.is_cpu() || !reduced(t)) return t * s;
  return (t.to(at::kFloat) * s).to(t.scalar_type());
}

void scale_(const at::Tensor& t, const at::Tensor& s) {
  if (s.is_cpu() || !reduced(t)) {
    t.mul_(s);
    return;
  }
  t.copy_(t.to(at::kFloat) * s);
}

}  // namespace dion::math
