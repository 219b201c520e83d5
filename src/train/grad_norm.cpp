// src/train/grad_norm.cpp — global gradient norm and clipping (dion/train/grad_norm.h).
#include "dion/train/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "dion/train/parallel.h"

namespace dion::train {

GradNorm grad_norm(const std::vector<at::Tensor>& params, Parallel& par, bool grads_summed_over_dp) {
  // Per part: the sum of squares in double, over chunks of 2^20 elements converted one at a time
  // (bounded memory). Not torch's fp32 vector_norm: over a 50304 x 64 lm_head its fp32
  // accumulation is off by up to 6e-5 relative, and by a different amount for each shard of it,
  // so the layouts would disagree. One host sync for all parts (they stay on the device).
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<at::Tensor> sums[2];  // [dense parts, MoE expert parts split over ep]
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const ParamPlacement* pl = par.world_size() > 1 ? &par.placement(p) : nullptr;
    // Whole on every tp rank (an MoE's experts and routers under tp): counted on tp rank 0 only.
    if (pl && pl->tp_dim < 0 && par.shape().tp > 1 && par.tp_rank() != 0) continue;
    const int k = pl && pl->ep_dim >= 0 ? 1 : 0;
    const at::Tensor flat = g.detach().reshape({-1});
    for (int64_t start = 0; start < flat.numel(); start += kChunk)
      sums[k].push_back(
          flat.narrow(0, start, std::min(kChunk, flat.numel() - start)).to(at::kDouble).square().sum().reshape({1}));
  }
  const double dense = sums[0].empty() ? 0.0 : at::cat(sums[0]).sum().item<double>();
  const double experts = sums[1].empty() ? 0.0 : at::cat(sums[1]).sum().item<double>();
  const double local = dense + experts;
  const std::shared_ptr<comm::Group>& dp = par.dp_group();
  const int dp_size = dp ? dp->size() : 1;
  const int dp_rank = dp ? dp->rank() : 0;
  const int edp_rank = par.edp_group() ? par.edp_group()->rank() : dp_rank;
  double counted = local, every = local;
  if (par.world_size() > 1) {
    // [each part once (the norm): the dense parts of dp rank 0, the experts of edp rank 0; every
    // rank's parts (finiteness)], summed over the world.
    at::Tensor t =
        at::tensor({(dp_rank == 0 ? dense : 0.0) + (edp_rank == 0 ? experts : 0.0), local}, at::kDouble);
    par.world().all_reduce_(t);
    counted = t[0].item<double>();
    every = t[1].item<double>();
  }
  GradNorm out;
  out.norm = std::sqrt(counted);
  if (!grads_summed_over_dp && dp_size > 1) out.norm *= double(dp_size);
  out.finite = std::isfinite(every) && std::isfinite(out.norm);
  return out;
}

double clip_gradients(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  if (!(norm > max_norm)) return 1.0;
  const double scale = max_norm / (norm + 1e-6);
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params) {
    at::Tensor g = p.grad();
    if (g.defined()) g.mul_(scale);
  }
  return scale;
}

}  // namespace dion::train
