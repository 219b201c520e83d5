// QK-clip's scale factors and per-head row scaling (dion/math/qk_clip.h).
#include "dion/math/qk_clip.h"

#include <ATen/ATen.h>

namespace dion::math {

at::Tensor qk_clip_factors(const at::Tensor& max_logits, double tau) {
  const at::Tensor s = max_logits.to(at::kDouble);
  return at::where(s > tau, tau / s, at::ones_like(s));  // -inf and S <= tau: 1
}

void scale_head_rows_(at::Tensor& w, const at::Tensor& rows, const at::Tensor& factor, int64_t head_dim,
                      double power) {
  if (w.numel() == 0) return;
  const at::Tensor r = rows.defined() ? rows.to(at::kLong) : at::arange(w.size(0), at::kLong);
  at::Tensor f = factor.to(at::kDouble).index_select(0, at::div(r, head_dim, "floor"));
  if (power != 1.0) f = at::pow(f, power);
  if (!at::any(f != 1.0).item<bool>()) return;  // nothing clipped on this rank: the weights untouched
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  shape[0] = w.size(0);
  w.mul_(f.to(w.scalar_type()).to(w.device()).view(shape));
}

}  // namespace dion::math
