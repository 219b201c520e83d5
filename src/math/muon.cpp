// Muon (Keller Jordan, 2024): momentum, orthogonalized update. See include/dion/math/muon.h.
#include "dion/math/muon.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "dion/cuda/fused.h"
#include "dion/math/rates.h"
#include "dion/math/elementwise.h"
#include "dion/math/own_kernels.h"
#include "scalar_tensor.h"

namespace dion::math {

std::vector<at::Tensor> muon_pre(at::TensorList G, at::TensorList M, float mu, bool nesterov,
                                 at::ScalarType comm_dtype) {
  RECORD_USER_SCOPE("dion::muon_pre");
  std::vector<at::Tensor> U;
  U.reserve(M.size());
  // The matrices to orthogonalize are written into one [N, *shape] buffer, so the megabatch
  // arrives stacked (stack_megabatch: a view, no copy). Not for one matrix whose U is M itself.
  at::Tensor stacked;
  const bool same_shape =
      !M.empty() && std::all_of(M.begin(), M.end(), [&](const at::Tensor& m) { return m.sizes() == M[0].sizes(); });
  if (same_shape && (M.size() > 1 || nesterov || comm_dtype != M[0].scalar_type())) {
    std::vector<int64_t> shape = {static_cast<int64_t>(M.size())};
    for (int64_t s : M[0].sizes()) shape.push_back(s);
    stacked = at::empty(shape, M[0].options().dtype(comm_dtype));
  }
  for (size_t i = 0; i < M.size(); ++i) {
    at::Tensor u = stacked.defined() ? stacked[static_cast<int64_t>(i)] : at::Tensor();
    if (own_fused_kernel(M[i], G[i]) && (comm_dtype == at::kFloat || comm_dtype == at::kBFloat16)) {
      // One pass on the GPU, bit-identical to the ATen ops below (dion/cuda/fused.h; opt-in:
      // dion/math/own_kernels.h).
      const bool write_u = u.defined() || nesterov || comm_dtype != M[i].scalar_type();  // else U is M itself
      if (write_u && !u.defined()) u = at::empty(M[i].sizes(), M[i].options().dtype(comm_dtype));
      cuda::momentum_(M[i], G[i], write_u ? u : at::Tensor(), mu, nesterov);
      U.push_back(write_u ? u : M[i]);
      continue;
    }
    if (u.defined() && cpu::cpu_fusable(M[i], G[i], u)) {
      cpu::momentum_(M[i], G[i], u, mu, nesterov);  // one pass, bit-identical to the ops below
      U.push_back(u);
      continue;
    }
    at::Tensor g = G[i].to(M[i].scalar_type());
    M[i].mul_(f32(mu)).add_(g);  // M = mu M + G
    at::Tensor r = nesterov ? M[i] * f32(mu) + g : M[i];
    if (u.defined()) {
      u.copy_(r);  // the same rounding as r.to(comm_dtype)
      U.push_back(u);
    } else {
      U.push_back(r.to(comm_dtype));
    }
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
  RECORD_USER_SCOPE("dion::muon_post");
  if (!cautious_wd) {
    const at::Tensor decay = r.decay_t(), alr = r.adjusted_lr_t();
    const at::Tensor neg_alr = r.on_device() ? r.neg_adjusted_lr_t() : at::Tensor();
    for (size_t i = 0; i < X.size(); ++i) {
      if (own_fused_kernel(X[i], U[i])) {  // one pass on the GPU, bit-identical to the two ops below
        if (r.on_device() && r.lr_dev.device() == X[i].device())
          cuda::decay_and_update_(X[i], U[i], decay, neg_alr);  // reads the values on the device
        else
          cuda::decay_and_update_(X[i], U[i], r.decay(), -r.adjusted_lr);
      } else if (!r.on_device() && cpu::cpu_fusable(X[i], U[i])) {  // the same on the CPU (host form)
        cpu::decay_and_update_(X[i], U[i], r.decay(), -r.adjusted_lr, /*step_in_x_dtype=*/false);
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
