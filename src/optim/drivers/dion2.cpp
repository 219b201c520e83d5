// Dion2 and NorDion2: their specs and one megabatch's update (the reference's dion2_update_megabatch_async,
// dion/dion2.py; NorDion2's per-neuron normalization of the selected rows, dion/nordion2.py).
//
//   pre:   M += G; select the top fraction of slices (rows or columns) by L1 norm;
//          U = M[selected]; M[selected] *= ef_decay (NorDion2: mu)      (math::dion2_pre)
//   ortho: U -> orthogonalized, assembled whole where the layout needs it
//   norm:  NorDion2 only: per-neuron variance EMA on the selected rows
//   post:  X *= 1 - lr wd;  X[selected] -= adjusted_lr U                (math::dion2_post)
//
// Which slices, on a matrix sharded along one of its two matrix dims (FSDP):
//   - NorDion2 selects rows; Dion2 along the shorter dim as one process would (selection_dim
//     "shorter"), or along the sharded dim as the reference does ("shard"; also what 3-D+
//     sharded matrices do);
//   - across the sharded dim (tall row-sharded, wide column-sharded, 2-D): partial norms summed
//     over the shards, every rank keeps its part of the selected slices;
//   - along the sharded dim, "global" scope (or 2-D sharding): the exact whole-matrix top-k from
//     the shards' norms (exact_global below); "local": each shard picks its own k.
#include <ATen/ATen.h>

#include "dion/math/dion2.h"
#include "dion/math/lr.h"
#include "dion/math/nordion2.h"
#include "dion/math/normuon.h"
#include "dion/errors.h"
#include "dion/optim/driver.h"

namespace dion::driver {

namespace {

// NorDion2's normalization of the orthogonalized selected rows O [N, .., k, n_local]: their rows
// of V [.., m, 1] updated in place; returns the normalized rows. `frobenius` / `columns`: the
// sums over the shards and over the column blocks (collectives.h; null / empty: local).
at::Tensor normalize_selected(const at::Tensor& O, const std::vector<at::Tensor>& V,
                              const std::vector<at::Tensor>& indices, const Options& o, const math::ShardSum& frobenius,
                              const math::ColumnShards& columns) {
  auto [normed, V_new] = math::nordion2_normalize_selected(O, at::stack(V, 0), at::stack(indices, 0),
                                                           f32(o.muon_beta2()), frobenius, columns);
  std::vector<at::Tensor> V_parts = V_new.unbind(0);
  for (size_t i = 0; i < V.size(); ++i) V[i].copy_(V_parts[i]);
  return normed;
}

// Dion2 / NorDion2 "global" selection on 2-D matrices sharded along the selection dim.
//
// The reference sends whole shards and selects on the assembled (bf16) matrices. Here each rank
// computes the float32 L1 norms of its own slices (a slice along the sharded dim is whole on one
// rank), the shards' norms give every rank the exact whole-matrix top-k (top_k_over_shards), and
// only the selected slices travel (padded to the largest per-rank count). The selection, and the
// order in which the orthogonalizer sees the selected slices, equal the single-process ones, and
// communication scales with `fraction` as in the local scope.
void exact_global(const Operands& ops, const Plan& plan, const Options& o, const Env& env, int64_t select_dim,
                  const math::Rates& rates, bool nor) {
  const auto& [X, G, M, V, adjust_shape] = ops;
  const Collectives& comm = *env.comm;
  const int64_t N = static_cast<int64_t>(X.size());
  const int64_t norm_dim = select_dim == -2 ? -1 : -2;
  const int64_t global = plan.layout.global_shape[2 + select_dim];
  const int64_t k = std::min(math::dion2_num_selected(o.fraction(), global), global);
  // The axis whose ranks hold whole slices along select_dim, and the one splitting them (2-D).
  const bool along_inner = plan.layout.two_d() && select_dim == plan.layout.inner_dim - 2;
  const Axis holder = along_inner ? Axis::INNER : Axis::OUTER, splitter = along_inner ? Axis::OUTER : Axis::INNER;

  for (int64_t i = 0; i < N; ++i) M[i].add_(G[i].to(M[i].scalar_type()));                           // M += G
  at::Tensor norms = at::linalg_vector_norm(at::stack(M, 0), 1, at::IntArrayRef{norm_dim}, false);  // [N, local]
  auto [idx, order, k_pad] = comm.top_k_over_shards(norms, k, global, holder, splitter);
  const float ef = f32(nor ? o.mu() : o.ef_decay());
  std::vector<at::Tensor> selected = math::dion2_take_selected(M, idx, ef, select_dim);  // [c_i, n] | [m, c_i]
  std::vector<at::Tensor> U(N);
  for (int64_t i = 0; i < N; ++i) {  // padded to k_pad slices: the same shape on every rank
    std::vector<int64_t> shape = M[i].sizes().vec();
    shape[2 + select_dim] = k_pad;
    U[i] = at::zeros(shape, M[i].options().dtype(env.ortho->dtype));
    U[i].narrow(select_dim, 0, idx[i].size(0)).copy_(selected[i]);
  }
  // The orthogonalizer sees each matrix's k selected slices in one process's order.
  at::Tensor O = comm.assemble_orthogonalize(std::move(U), plan, o, *env.ortho_fn, {}, {}, along_inner ? 0 : k_pad,
                                             along_inner ? k_pad : 0, std::move(order), select_dim);  // [N, k_pad | ..]
  if (nor) {
    std::vector<at::Tensor> Vsel;
    for (int64_t i = 0; i < N; ++i) {
      at::Tensor v = at::zeros({k_pad, 1}, V[i].options().dtype(at::kFloat));
      v.narrow(0, 0, idx[i].size(0)).copy_(V[i].index_select(0, idx[i]));
      Vsel.push_back(v);
    }
    auto [normed, V_new] = math::normuon_normalize(O, at::stack(Vsel, 0), f32(o.muon_beta2()), {},
                                                   comm.sum_norms_over_shards(), comm.column_shards(plan));
    for (int64_t i = 0; i < N; ++i)
      V[i].index_copy_(0, idx[i], V_new[i].narrow(0, 0, idx[i].size(0)).to(V[i].scalar_type()));
    O = normed;
  }
  std::vector<at::Tensor> Us;
  for (int64_t i = 0; i < N; ++i) Us.push_back(O[i].narrow(select_dim, 0, idx[i].size(0)));
  math::dion2_post(X, Us, idx, rates, select_dim);
}

// The local scope's per-shard count of slices along the sharded dim (every shard zero-padded to
// ceil(global / W)).
int64_t local_selection_count(const Plan& plan, const Options& o) {
  const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
  const int64_t global = plan.layout.global_shape[ndim + plan.comm_dim];
  return math::dion2_num_selected(o.fraction(), (global + plan.world - 1) / plan.world);
}

// The local scope's per-shard top-k takes every slice of every shard (fraction 1): the same
// slices as the whole-matrix top-k.
bool local_selects_every_slice(const Plan& plan, const Options& o) {
  const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
  const int64_t global = plan.layout.global_shape[ndim + plan.comm_dim];
  return local_selection_count(plan, o) >= (global + plan.world - 1) / plan.world;
}

// Slices split across 1-D shards (selecting along the unsharded dim) can be selected as one
// process does: partial norms summed over the shards. Not for flattened 3-D+ parameters.
bool across_shards_possible(const Plan& plan, const Options& o, size_t nd) {
  return plan.matrix_sharded() && !plan.layout.two_d() && (nd == 2 || !o.flatten());
}

// How Dion2 / NorDion2 select the slices of one megabatch; the layout decides (the top of this
// file). One process, DDP and batch-sharded matrices hold whole matrices: LOCAL.
enum class Selection {
  LOCAL,             // each rank's top-k of the slices it holds: whole matrices, or per-shard (local scope)
  ACROSS_SHARDS,     // slices split across the shards: partial norms summed, every rank keeps its part
  EXACT_GLOBAL,      // 2-D matrices along a sharded dim: the whole-matrix top-k from the shards' norms
  ASSEMBLED_GLOBAL,  // 3-D+ along the sharded dim: whole shards travel, top-k on the assembled matrices
};

struct SelectionChoice {
  Selection selection;
  int64_t select_dim;  // -2: rows, -1: columns
};

// `scope`, `along`: the group's selection_scope and selection_dim (dion/optim/hyperparameters.h).
SelectionChoice choose_selection(const Plan& plan, const Options& o, SelectionScope scope, SelectionDim along,
                                 const std::vector<int64_t>& shape, bool nor) {
  const size_t nd = shape.size();
  const bool sharded = plan.matrix_sharded(), two_d = plan.layout.two_d();
  const bool across_ok = across_shards_possible(plan, o, nd);
  // Where one process's selection can be reproduced: across 1-D shards, or either sharded dim of
  // a 2-D-sharded 2-D matrix (EXACT_GLOBAL along the outer or the inner dim).
  const bool as_one_process = across_ok || (sharded && two_d);
  int64_t select_dim;
  if (nor)
    select_dim = -2;  // NorDion2 selects rows
  else if (sharded && (along == SelectionDim::SHARD || !as_one_process) && (plan.comm_dim == -2 || plan.comm_dim == -1))
    select_dim = plan.comm_dim;  // the reference's choice: along the sharded dim
  else
    select_dim = math::dion2_select_dim(shape[nd - 2], shape.back());  // one process's choice
  const bool whole_matrix = scope == SelectionScope::GLOBAL || (sharded && local_selects_every_slice(plan, o));
  if (across_ok && select_dim != plan.comm_dim) return {Selection::ACROSS_SHARDS, select_dim};
  if (sharded && nd == 2 && (two_d || (whole_matrix && select_dim == plan.comm_dim)))
    return {Selection::EXACT_GLOBAL, select_dim};
  if (sharded && whole_matrix) return {Selection::ASSEMBLED_GLOBAL, select_dim};
  return {Selection::LOCAL, select_dim};
}

// NorDion2's fused fast update of the selected rows (math::normuon_update_fast) applies: the fast
// path, whole matrices on this rank, host rates.
bool nordion2_fused_update_applies(const Plan& plan, const Env& env, const math::Rates& rates) {
  return env.ortho->path == math::OrthoPath::FAST && !plan.matrix_sharded() && !rates.on_device();
}

// `nor`: the per-neuron normalization of the selected rows (rows are always the selection).
void dion2_family_update(const Batch& batch, const Options& o, const Env& env, bool nor) {
  const Collectives& comm = *env.comm;
  const Plan& plan = batch.plan;  // dion2_check_plan has refused what this cannot run
  const bool matrix_sharded = plan.matrix_sharded();
  Operands ops = operands(batch, plan, nor, comm);
  const auto& [X, G, M, V, adjust_shape] = ops;
  const auto [selection, select_dim] = choose_selection(plan, o, selection_scope_from(o.selection_scope()),
                                                        selection_dim_from(o.selection_dim()), adjust_shape, nor);
  const float ef = f32(nor ? o.mu() : o.ef_decay());
  const math::Rates rates =
      rates_for(batch, o, env, math::adjusted_lr_factor(o.adjust_lr(), adjust_shape, o.flatten()));
  const math::ShardSum reduce = matrix_sharded && plan.comm_dim == -2 ? comm.sum_norms_over_shards() : nullptr;

  switch (selection) {
    case Selection::ACROSS_SHARDS: {
      // Selecting along the unsharded dim (tall row-sharded, wide column-sharded): every slice
      // is split across the shards; partial L1 norms summed over them give every rank the
      // single-process top-k, each rank keeps its part of the selected slices [.., local, k],
      // and the submatrix is assembled along the sharded dim. Either selection scope: the
      // selection is whole-matrix and the traffic scales with `fraction`.
      math::Selection sel =
          math::dion2_pre(G, M, o.fraction(), ef, select_dim, env.ortho->dtype, 0, comm.sum_norms_over_shards());
      at::Tensor O = comm.assemble_orthogonalize(std::move(sel.U), plan, o, *env.ortho_fn, {}, {});
      // NorDion2 (column-sharded): each selected row is split, its per-neuron sum crosses ranks.
      if (nor) O = normalize_selected(O, V, sel.indices, o, comm.shard_sum(plan), comm.column_shards(plan));
      math::dion2_post(X, O.unbind(0), sel.indices, rates, select_dim);
      return;
    }
    case Selection::EXACT_GLOBAL:
      exact_global(ops, plan, o, env, select_dim, rates, nor);
      return;
    case Selection::ASSEMBLED_GLOBAL: {
      // 3-D+ sharded matrices: whole shards travel and the exact top-k is taken on the
      // assembled matrices (the reference's global scope).
      const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
      const int64_t global_select = plan.layout.global_shape[ndim + select_dim];
      std::vector<at::Tensor> U = math::dion2_accumulate(G, M, env.ortho->dtype);
      math::OrthoFn select = math::dion2_select_then(*env.ortho_fn, o.fraction(), select_dim, global_select);
      at::Tensor O = comm.assemble_orthogonalize(std::move(U), plan, o, select, {}, {});
      std::vector<at::Tensor> Us = O.unbind(0);
      if (nor)
        math::nordion2_post_masked(X, M, V, Us, rates, ef, f32(o.muon_beta2()), reduce);
      else
        math::dion2_post_masked(X, M, Us, rates, ef, select_dim);
      return;
    }
    case Selection::LOCAL:
      break;
  }
  // Local selection: every rank picks the same count k of its own slices.
  const int64_t k = matrix_sharded ? local_selection_count(plan, o) : 0;
  math::Selection sel = math::dion2_pre(G, M, o.fraction(), ef, select_dim, env.ortho->dtype, k);
  at::Tensor O = comm.assemble_orthogonalize(std::move(sel.U), plan, o, *env.ortho_fn, {}, {}, k);
  // FAST path, local rows, host rates: NorDion2's normalization fused with the update.
  if (nor && nordion2_fused_update_applies(plan, env, rates) &&
      math::normuon_update_fast(X, O, V, sel.indices, f32(o.muon_beta2()), rates.lr, rates.adjusted_lr,
                                rates.weight_decay))
    return;
  if (nor) O = normalize_selected(O, V, sel.indices, o, reduce, {});
  math::dion2_post(X, O.unbind(0), sel.indices, rates, select_dim);
}

void dion2_step(const Batch& b, const Options& o, const Env& e) { dion2_family_update(b, o, e, false); }
void nordion2_step(const Batch& b, const Options& o, const Env& e) { dion2_family_update(b, o, e, true); }

// Dion2's and NorDion2's refusals of a layout (plan_for calls it in step(), before any task runs).
void dion2_check_plan(const Plan& plan, const Options&, const std::string& where) {
  if (plan.matrix_sharded() && plan.layout.two_d() && plan.layout.global_shape.size() > 2)
    throw NotImplementedError(where +
                              ": 2-D (FSDP x TP) sharding of parameters with more than 2 dims is not supported "
                              "by this algorithm (the selection would not equal one process's); shard 2-D "
                              "parameters only, or one dim (docs/distributed.md)");
}

AlgorithmSpec dion2_spec() {
  AlgorithmSpec s;
  s.name = "dion2";
  s.state = [](const ParamView& p, const Options&) { return std::vector<StateSpec>{momentum_like(p)}; };
  s.check_plan = dion2_check_plan;
  s.update = dion2_step;
  return s;
}

AlgorithmSpec nordion2_spec() {
  AlgorithmSpec s = dion2_spec();
  s.name = "nordion2";
  s.aliases = {"dion3"};
  s.state = [](const ParamView& p, const Options&) {
    return std::vector<StateSpec>{momentum_like(p), neuron_variance(p)};
  };
  s.check_plan = [](const Plan& plan, const Options& o, const std::string& where) {
    dion2_check_plan(plan, o, where);
    // A flattened 3-D+ parameter sharded along its last dim: the selection of rows of the
    // flattened matrix is not one process's (whole shards travel; rows stay split).
    if (plan.comm_dim == -1 && o.flatten() && plan.layout.global_shape.size() > 2)
      throw NotImplementedError(where +
                                ": nordion2 with flatten on a parameter sharded along its last dim is not "
                                "supported (the row selection would not equal one process's); shard another dim");
  };
  s.update = nordion2_step;
  return s;
}

}  // namespace

}  // namespace dion::driver

DION_BUILTIN_DRIVER(dion2) {
  register_algorithm(driver::dion2_spec());
  register_algorithm(driver::nordion2_spec());
}
