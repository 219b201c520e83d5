// Muon (Keller Jordan, 2024): momentum, orthogonalized update. See include/dion/math/muon.h.
#include "dion/math/muon.h"

#include <ATen/ATen.h>

#include "scalar_tensor.h"

namespace dion::math {

std::vector<at::Tensor> muon_pre(at::TensorList G, at::TensorList M, float mu, bool nesterov,
                                 at::ScalarType comm_dtype) {
  std::vector<at::Tensor> U;
  U.reserve(M.size());
  for (size_t i = 0; i < M.size(); ++i) {
    at::Tensor g = G[i].to(M[i].scalar_type());
    M[i].mul_(f32(mu)).add_(g);                  // M = mu M + G
    at::Tensor u = nesterov ? M[i] * f32(mu) + g : M[i];
    U.push_back(u.to(comm_dtype));
  }
  return U;
}

void apply_weight_decay(at::TensorList X, at::TensorList U, float lr, float weight_decay,
                        bool cautious_wd) {
  if (cautious_wd) {
    const at::Tensor coeff = f32(lr * weight_decay);
    for (size_t i = 0; i < X.size(); ++i) {
      // mask = 1 where X and U agree in sign (or either is 0), else 0
      at::Tensor mask = at::clamp_max(at::sign(X[i] * U[i]) + 1, 1);
      X[i].sub_(X[i] * mask * coeff);
    }
  } else {
    const at::Tensor decay = f32(1.0f - lr * weight_decay);
    for (const at::Tensor& x : X) x.mul_(decay);
  }
}

void muon_post(at::TensorList X, at::TensorList U, float lr, float adjusted_lr, float weight_decay,
               bool cautious_wd) {
  apply_weight_decay(X, U, lr, weight_decay, cautious_wd);
  const at::Tensor alr = f32(adjusted_lr);
  for (size_t i = 0; i < X.size(); ++i) X[i].sub_(U[i] * alr);
}

}  // namespace dion::math
