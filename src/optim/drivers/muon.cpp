// Muon and NorMuon: their specs and one megabatch's update (the reference's muon_update_megabatch_async,
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
#include "dion/errors.h"
#include "dion/optim/driver.h"

namespace dion::driver {

namespace {

// NorMuon's fused fast update (math::normuon_update_fast) applies: the fast path, host rates,
// each rank holding whole rows (no sums over shards or column blocks), no split_sizes and no
// cautious weight decay (the fused kernel has neither).
bool normuon_fused_update_applies(const Plan& plan, const Options& o, const Env& env, const math::Rates& rates) {
  const Collectives& comm = *env.comm;
  return env.ortho->path == math::OrthoPath::FAST && !rates.on_device() && !comm.shard_sum(plan) &&
         !comm.column_shards(plan).sum_over_columns && o.split_sizes().empty() && !o.cautious_wd();
}

// `nor`: NorMuon's per-neuron normalization after the orthogonalization.
void muon_family_update(const Batch& batch, const Options& o, const Env& env, bool nor) {
  const Collectives& comm = *env.comm;
  const Plan& plan = batch.plan;
  auto [X, G, M, V, adjust_shape] = operands(batch, plan, nor, comm);
  std::vector<double> scales;  // split_sizes excludes num_heads: adjust_shape is the global shape
  if (!o.split_sizes().empty()) scales = math::split_lr_scales(o.split_sizes(), adjust_shape, o.adjust_lr());

  std::vector<at::Tensor> U = math::muon_pre(G, M, f32(o.mu()), o.nesterov(), env.ortho->dtype);
  at::Tensor O = comm.assemble_orthogonalize(std::move(U), plan, o, *env.ortho_fn, o.split_sizes(), scales);
  const math::Rates rates =
      rates_for(batch, o, env, math::adjusted_lr_factor(o.adjust_lr(), adjust_shape, o.flatten()));
  // FAST path, local rows, host rates: NorMuon's normalization fused with the update (two
  // passes over O).
  if (nor && normuon_fused_update_applies(plan, o, env, rates) &&
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

}  // namespace

namespace {

void muon_step(const Batch& b, const Options& o, const Env& e) { muon_family_update(b, o, e, false); }
void normuon_step(const Batch& b, const Options& o, const Env& e) { muon_family_update(b, o, e, true); }

AlgorithmSpec muon_spec() {
  AlgorithmSpec s;
  s.name = "muon";
  s.supports_split_sizes = true;
  s.state = [](const ParamView& p, const Options&) { return std::vector<StateSpec>{momentum_like(p)}; };
  s.update = muon_step;
  return s;
}

AlgorithmSpec normuon_spec() {
  AlgorithmSpec s = muon_spec();
  s.name = "normuon";
  s.state = [](const ParamView& p, const Options&) {
    return std::vector<StateSpec>{momentum_like(p), neuron_variance(p)};
  };
  s.check_plan = [](const Plan& plan, const Options& o, const std::string& where) {
    // The per-block normalization needs each block's rows on one rank: fine when only the
    // columns are sharded (the per-neuron sums cross ranks), not when the rows are.
    if (!o.split_sizes().empty() && plan.communicate && plan.splits(-2))
      throw NotImplementedError(where + ": normuon with split_sizes on parameters sharded along their rows (dim " +
                                std::to_string(plan.layout.global_shape.size() - 2) +
                                ") is not supported; shard the last dim instead");
  };
  s.update = normuon_step;
  return s;
}

}  // namespace

}  // namespace dion::driver

DION_BUILTIN_DRIVER(muon) {
  register_algorithm(driver::muon_spec());
  register_algorithm(driver::normuon_spec());
}
