// Muon (Keller Jordan, 2024): momentum, orthogonalized update. See include/dion/math/muon.h.
#include "dion/math/muon.h"

#include <ATen/ATen.h>

#include "dion/cuda/fused.h"
#include "dion/math/rates.h"
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

void apply_weight_decay(at::TensorList X, at::TensorList U, const Rates& r, bool cautious_wd) {
  if (cautious_wd) {
    const at::Tensor coeff = r.lr_wd_t();
    for (size_t i = 0; i < X.size(); ++i) {
      // mask = 1 where X and U agree in sign (or either is 0), else 0
      at::Tensor mask = at::clamp_max(at::sign(X[i] * U[i]) + 1, 1);
      X[i].sub_(scale(X[i] * mask, coeff));
    }
  } else {
    const at::Tensor decay = r.decay_t();
    for (const at::Tensor& x : X) scale_(x, decay);
  }
}

void muon_post(at::TensorList X, at::TensorList U, const Rates& r, bool cautious_wd) {
  if (!cautious_wd) {
    const at::Tensor decay = r.decay_t(), alr = r.adjusted_lr_t();
    const at::Tensor neg_alr = r.on_device() ? r.neg_adjusted_lr_t() : at::Tensor();
    for (size_t i = 0; i < X.size(); ++i) {
      if (cuda::fusable(X[i], U[i])) {  // one pass on the GPU, bit-identical to the two ops below
        if (r.on_device() && r.lr_dev.device() == X[i].device())
          cuda::decay_and_update_(X[i], U[i], decay, neg_alr);  // reads the values on the device
        else
          cuda::decay_and_update_(X[i], U[i], r.decay(), -r.adjusted_lr);
      } else {
        scale_(X[i], decay);
        X[i].sub_(scale(U[i], alr));
      }
    }
    return;
  }
  apply_weight_decay(X, U, r, cautious_wd);
  const at::Tensor alr = r.adjusted_lr_t();
  for (size_t i = 0; i < X.size(); ++i) X[i].sub_(scale(U[i], alr));
}

}  // namespace dion::math
