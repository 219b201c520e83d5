// src/train/grad_norm.cpp — global gradient norm and clipping (dion/train/grad_norm.h).
#include "dion/train/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>

#include "dion/train/parallel.h"

namespace dion::train {

namespace {

// The sum of squares of n fp32 values in double, in one pass: 16 lanes of double accumulators
// (GCC vector types: the same lanes and order of additions on every instruction set, so one
// result whichever clone runs), their lanes summed at the end, then the tail. An AVX-512 or AVX2
// clone is chosen for the CPU at load time.
__attribute__((target_clones("avx512f", "avx2", "default"))) double sum_of_squares(const float* p, int64_t n) {
  typedef double v8d __attribute__((vector_size(64)));
  typedef float v8f __attribute__((vector_size(32)));
  v8d a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8f x0, x1;
    std::memcpy(&x0, p + i, sizeof x0);
    std::memcpy(&x1, p + i + 8, sizeof x1);
    const v8d d0 = __builtin_convertvector(x0, v8d), d1 = __builtin_convertvector(x1, v8d);
    a0 += d0 * d0;
    a1 += d1 * d1;
  }
  double s = 0;
  for (int j = 0; j < 8; ++j) s += a0[j] + a1[j];
  for (; i < n; ++i) s += double(p[i]) * double(p[i]);
  return s;
}

}  // namespace

GradNorm grad_norm(const std::vector<at::Tensor>& params, Parallel& par, bool grads_summed_over_dp) {
  // Per part: the sum of squares in double; fp32 on the CPU in one pass (sum_of_squares), else
  // over chunks of 2^20 elements converted one at a time (bounded memory). Not torch's fp32
  // vector_norm: over a 50304 x 64 lm_head its fp32 accumulation is off by up to 6e-5 relative,
  // and by a different amount for each shard of it, so the layouts would disagree. One host sync
  // for all parts (they stay on the device).
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
    if (flat.is_cpu() && flat.scalar_type() == at::kFloat && flat.is_contiguous()) {
      sums[k].push_back(at::tensor({sum_of_squares(flat.const_data_ptr<float>(), flat.numel())}, at::kDouble));
      continue;
    }
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
