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
  const Mesh& mesh = par.mesh();
  const Layout& layout = mesh.layout();
  const bool parallel = mesh.world_size() > 1;
  std::vector<at::Tensor> sums[kReplicaAxes];  // by the axis of the parts' replicas
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const Placement* pl = parallel ? &par.placement(p) : nullptr;
    if (pl && layout.tp_copy(*pl, mesh.rank())) continue;  // tp rank 0 holds the same
    const int k = pl ? int(layout.replica_axis(*pl)) : 0;
    const at::Tensor flat = g.detach().reshape({-1});
    for (int64_t start = 0; start < flat.numel(); start += kChunk)
      sums[k].push_back(
          flat.narrow(0, start, std::min(kChunk, flat.numel() - start)).to(at::kDouble).square().sum().reshape({1}));
  }
  double by_axis[kReplicaAxes], local = 0, counted = 0;
  for (int k = 0; k < kReplicaAxes; ++k) {
    by_axis[k] = sums[k].empty() ? 0.0 : at::cat(sums[k]).sum().item<double>();
    local += by_axis[k];
    // Each part once (the norm): the first of its replicas counts it (one process: every part).
    const auto& replicas = mesh.replicas(ReplicaAxis(k));
    counted += (!replicas || replicas->rank() == 0) ? by_axis[k] : 0.0;
  }
  double every = local;
  if (parallel) {
    // [each part once (the norm), every rank's parts (finiteness)], summed over the world.
    at::Tensor t = at::tensor({counted, local}, at::kDouble);
    par.mesh().world().all_reduce_(t);
    counted = t[0].item<double>();
    every = t[1].item<double>();
  }
  const std::shared_ptr<comm::Group>& dp = mesh.replicas(ReplicaAxis::dp);
  const int dp_size = dp ? dp->size() : 1;
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
