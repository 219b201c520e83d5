// Muon and NorMuon: one megabatch's update (the reference's muon_update_megabatch_async,
// dion/muon.py; NorMuon's per-neuron normalization, dion/normuon.py).
//
//   pre:   M = mu M + G;  U = nesterov ? G + mu M : M             (math::muon_pre)
//   ortho: U -> orthogonalized, assembled whole where the layout needs it
//   norm:  NorMuon only: per-neuron (row) variance EMA, rows rescaled (math::normuon_normalize)
//   post:  X *= 1 - lr wd (cautious: where signs agree);  X -= adjusted_lr U
#include <ATen/ATen.h>

#include "dion/math/lr.h"
#include "dion/math/muon.h"
#include "dion/math/normuon.h"
#include "driver.h"

namespace dion::driver {

void muon_update(const Batch& batch, const Options& o, const Env& env) {
  const Collectives& comm = *env.comm;
  const bool nor = o.algo() == Algorithm::NorMuon;
  const Plan plan = plan_for(comm.distribution(), batch.params, o, batch.group);
  auto [X, G, M, V, adjust_shape] = operands(batch, plan, nor, comm);
  std::vector<double> scales;  // split_sizes excludes num_heads: adjust_shape is the global shape
  if (!o.split_sizes().empty()) scales = math::split_lr_scales(o.split_sizes(), adjust_shape, o.adjust_lr());

  std::vector<at::Tensor> U = math::muon_pre(G, M, f32(o.mu()), o.nesterov(), env.ortho->dtype);
  at::Tensor O = comm.assemble_orthogonalize(std::move(U), plan, o, *env.ortho_fn, o.split_sizes(), scales);
  const math::Rates rates =
      rates_for(batch, o, env, math::adjusted_lr_factor(o.adjust_lr(), adjust_shape, o.flatten()));
  // FAST path, local rows, host rates: NorMuon's normalization fused with the update (two
  // passes over O).
  if (nor && env.ortho->path == math::OrthoPath::FAST && !rates.on_device() && !comm.shard_sum(plan) &&
      !comm.column_shards(plan).sum_over_columns && o.split_sizes().empty() && !o.cautious_wd() &&
      math::normuon_update_fast(X, O, V, {}, f32(o.muon_beta2()), rates.lr, rates.adjusted_lr, rates.weight_decay))
    return;
  if (nor) {
    // Each rank normalizes its part of the rows as one process would: the Frobenius norms summed
    // over the shards, the per-neuron sums over the column blocks when the columns are sharded.
    // (plan_for refuses split_sizes where the rows are sharded.)
    auto [normed, V_new] = math::normuon_normalize(O, at::stack(V, 0), f32(o.muon_beta2()), o.split_sizes(),
                                                   comm.shard_sum(plan), comm.column_shards(plan));
    std::vector<at::Tensor> V_parts = V_new.unbind(0);
    for (size_t i = 0; i < V.size(); ++i) V[i].copy_(V_parts[i]);
    O = normed;
  }
  math::muon_post(X, O.unbind(0), rates, o.cautious_wd());
}

}  // namespace dion::driver
