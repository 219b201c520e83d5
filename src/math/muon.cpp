// Muon (Keller Jordan, 2024): momentum, orthogonalized update. See include/dion/math/muon.h.
#include "dion/math/muon.h"

#include <ATen/ATen.h>

#include "dion/cuda/fused.h"
#include "scalar_tensor.h"

namespace dion::math {

std::vector<at::Tensor> muon_pre(at::TensorList G, at::TensorList M, float mu, bool nesterov,
                                 at::ScalarType comm_dtype) {
  std::vector<at::Tensor> U;
  U.reserve(M.size());
  for (size_t i = 0; i < M.size(); ++i) {
    if (cuda::fusable(M[i], G[i]) && (comm_dtype == at::kFloat || comm_dtype == at::kBFloat16)) {
      // One pass on the GPU, bit-identical to the ATen ops below (dion/cuda/fused.h).
      const bool write_u = nesterov || comm_dtype != M[i].scalar_type();  // else U is M itself
      at::Tensor u = write_u ? at::empty(M[i].sizes(), M[i].options().dtype(comm_dtype)) : at::Tensor();
      cuda::momentum_(M[i], G[i], u, mu, nesterov);
      U.push_back(write_u ? u : M[i]);
      continue;
    }
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
  if (!cautious_wd) {
    const at::Tensor decay = f32(1.0f - lr * weight_decay), alr = f32(adjusted_lr);
    for (size_t i = 0; i < X.size(); ++i) {
      if (cuda::fusable(X[i], U[i])) {  // one pass on the GPU, bit-identical to the two ops below
        cuda::decay_and_update_(X[i], U[i], 1.0f - lr * weight_decay, -adjusted_lr);
      } else {
        X[i].mul_(decay);
        X[i].sub_(U[i] * alr);
      }
    }
    return;
  }
  apply_weight_decay(X, U, lr, weight_decay, cautious_wd);
  const at::Tensor alr = f32(adjusted_lr);
  for (size_t i = 0; i < X.size(); ++i) X[i].sub_(U[i] * alr);
}

}  // namespace dion::math
