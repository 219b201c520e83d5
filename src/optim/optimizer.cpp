// The optimizer classes: grouping, state, megabatching, dispatch to the algorithm math.
// See include/dion/optim/optimizer.h. Layouts and collectives live in the distribution layer;
// the math lives in src/math/.
#include "dion/optim/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <ATen/ThreadLocalState.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <tuple>
#include <sstream>

#include "dion/comm/tasks.h"
#include "dion/math/dion.h"
#include "dion/math/dion2.h"
#include "dion/math/muon.h"
#include "dion/math/nordion2.h"
#include "dion/math/normuon.h"
#include "dion/math/scalar.h"
#include "agreement.h"
#include "state_layout.h"

namespace dion {

double lm_head_lr_scale(const std::string& scalar_opt, int64_t model_dim) {
  return scalar_opt == "lion" ? 1.0 / std::sqrt(static_cast<double>(model_dim)) : 1.0;
}

namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Same-shape, same-dtype, same-layout parameters, in order of first appearance (the reference's
// dict order). The layout is part of the key: under 2-D sharding a column-parallel [C, C] weight
// (FSDP on dim 1, TP on dim 0) and a row-parallel one (FSDP on dim 0, TP on dim 1) have the same
// local shape but are assembled along different dims, so they cannot share a plan.
std::vector<std::vector<at::Tensor>> megabatches(const std::vector<at::Tensor>& params, const Distribution* dist) {
  std::vector<std::vector<at::Tensor>> out;
  using Key = std::tuple<std::vector<int64_t>, at::ScalarType, std::vector<int64_t>, int64_t, int64_t>;
  std::map<Key, size_t> index;
  for (const at::Tensor& p : params) {
    Key key{p.sizes().vec(), p.scalar_type(), {}, -1, -1};
    if (dist) {
      const Layout L = dist->layout(p);
      std::get<2>(key) = L.global_shape;
      std::get<3>(key) = L.shard_dim;
      std::get<4>(key) = L.inner_dim;
    }
    auto it = index.find(key);
    if (it == index.end()) {
      index.emplace(key, out.size());
      out.push_back({p});
    } else {
      out[it->second].push_back(p);
    }
  }
  return out;
}

// Per-head orthogonalization: in-place updates on the views land in the parameters and state.
// View 2-D tensors [rows, n] (a whole [H * hd, n] parameter, or a row shard of one holding whole
// heads) as [rows / hd, hd, n].
std::vector<at::Tensor> head_views(const std::vector<at::Tensor>& ts, int64_t head_dim) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) {
    TORCH_CHECK(t.size(0) % head_dim == 0, "a shard of ", t.size(0), " rows does not hold whole heads of ", head_dim,
                " rows; shard boundaries must fall on heads");
    std::vector<int64_t> shape = {t.size(0) / head_dim, head_dim};
    for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
    out.push_back(t.view(shape));
  }
  return out;
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> g;
  for (const at::Tensor& p : params) g.push_back(p.grad());
  return g;
}

float f32(double v) { return static_cast<float>(v); }

// A 0-d float32 tensor: how the reference passes hyperparameters to elementwise kernels.
at::Tensor scalar32(float v) { return at::scalar_tensor(v, at::kFloat); }

}  // namespace

// ---------------------------------------------------------------------------- construction

Optimizer::Optimizer(math::OrthoConfig ortho, const Options& defaults, std::string only_algorithm,
                     std::shared_ptr<Distribution> distribution)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<Options>(defaults)),
      ortho_(std::move(ortho)),
      ortho_fn_(ortho_.function()),
      only_algorithm_(std::move(only_algorithm)),
      dist_(std::move(distribution)) {
  defaults.validate(0);
}

Optimizer::Optimizer(const std::vector<ParamGroup>& groups, const Options& defaults,
                     math::OrthoConfig ortho, std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), defaults, "*", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Optimizer::Optimizer(std::vector<at::Tensor> params, const Options& defaults, math::OrthoConfig ortho,
                     std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), defaults, "*", std::move(distribution)) {
  add_group_checked(std::move(params), defaults);
}

void Optimizer::add_param_group(const ParamGroup& group) {
  add_group_checked(group.params, group.options.apply(static_cast<const Options&>(defaults())));
}

void Optimizer::add_group_checked(std::vector<at::Tensor> params, Options options) {
  const size_t index = param_groups_.size();
  options.validate(index);
  check_group(index, params, options);
  torch::optim::Optimizer::add_param_group(
      torch::optim::OptimizerParamGroup(std::move(params), std::make_unique<Options>(options)));
}

void Optimizer::check_group(size_t g, const std::vector<at::Tensor>& params, const Options& o) const {
  const std::string& algo = o.algorithm();
  const std::string where = "param group " + std::to_string(g) + " (" + algo + ")";
  if (only_algorithm_ != "*" && algo != only_algorithm_ && algo != "adamw" && algo != "lion")
    throw ValueError(where + ": this optimizer runs '" + only_algorithm_ +
                     "' matrix groups plus 'adamw' and 'lion' groups; use dion::Optimizer to mix "
                     "matrix algorithms");
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    // A shard is checked as the whole parameter it is part of.
    const std::vector<int64_t> shape = dist_ ? dist_->layout(p).global_shape : p.sizes().vec();
    const std::string what = where + ", parameter " + std::to_string(i) + " of shape " + shape_str(shape);
    if (!p.is_floating_point()) throw TypeError(what + ": parameters must be floating point");
    if (is_matrix_algorithm(algo) && p.dim() < 2)
      throw ValueError(what + ": '" + algo +
                       "' needs matrix parameters (ndim >= 2); put vectors and scalars in an "
                       "'adamw' or 'lion' group");
    if (algo == "adamw" && o.variance_dtype() && *o.variance_dtype() != p.scalar_type())
      throw ValueError(what + ": variance_dtype " + std::string(c10::toString(*o.variance_dtype())) +
                       " must equal the parameter dtype for adamw (the fused AdamW kernel needs one dtype)");
    if (algo == "dion" && p.dim() != 2)
      throw NotImplementedError(what + ": legacy 'dion' supports 2-D parameters only");
    if (o.num_heads() > 1 && is_matrix_algorithm(algo)) {
      if (p.dim() != 2)
        throw ValueError(what + ": num_heads is only supported for 2-D parameters");
      if (shape[0] % o.num_heads() != 0)
        throw ValueError(what + ": num_heads (" + std::to_string(o.num_heads()) +
                         ") must divide dim 0 (" + std::to_string(shape[0]) + ")");
    }
    if (!o.split_sizes().empty() && is_matrix_algorithm(algo)) {
      if (p.dim() != 2) throw ValueError(what + ": split_sizes is only supported for 2-D parameters");
      int64_t total = 0;
      for (int64_t s : o.split_sizes()) total += s;
      if (total != shape[0])
        throw ValueError(what + ": split_sizes sum to " + std::to_string(total) +
                         " but must sum to dim 0 (" + std::to_string(shape[0]) + ")");
    }
  }
}

Options& Optimizer::options(size_t group) {
  TORCH_CHECK(group < param_groups_.size(), "no param group ", group, " (have ", param_groups_.size(), ")");
  return static_cast<Options&>(param_groups_[group].options());
}
const Options& Optimizer::options(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "no param group ", group, " (have ", param_groups_.size(), ")");
  return static_cast<const Options&>(param_groups_[group].options());
}

void Optimizer::check_options(size_t group, const Options& o) const {
  TORCH_CHECK(group < param_groups_.size(), "no param group ", group, " (have ", param_groups_.size(), ")");
  o.validate(group);
  check_group(group, param_groups_[group].params(), o);
}

void Optimizer::set_options(size_t group, const Options& o) {
  check_options(group, o);
  Options& current = options(group);
  if (o.algorithm() != current.algorithm())
    for (const at::Tensor& p : param_groups_[group].params()) state_.erase(p.unsafeGetTensorImpl());
  current = o;
}

ParamState* Optimizer::state_of(const at::Tensor& param) {
  auto it = state_.find(param.unsafeGetTensorImpl());
  return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
}

// ---------------------------------------------------------------------------- state

ParamState& Optimizer::state_for(const at::Tensor& p, const Options& o) {
  auto& slot = state_[p.unsafeGetTensorImpl()];
  if (!slot) {
    at::NoGradGuard no_grad;
    auto s = std::make_unique<ParamState>();
    const std::string& algo = o.algorithm();
    const auto momentum_dtype = algo == "dion" ? o.momentum_dtype().value_or(p.scalar_type()) : p.scalar_type();
    s->momentum(at::zeros_like(p, p.options().dtype(momentum_dtype)));
    if (algo == "adamw") {
      s->variance(at::zeros_like(p, p.options().dtype(o.variance_dtype().value_or(p.scalar_type()))));
      s->step_dev(at::zeros({}, p.options().dtype(at::kFloat)));
    }
    if (algo == "normuon" || algo == "nordion2") {
      // [.., m, 1], param dtype; [.., m, 0] for an empty parameter (the reference's p[..., 0:1])
      s->variance_neuron(at::zeros_like(p.slice(-1, 0, 1)));
    }
    if (algo == "dion") {
      // Q [n', r] for the whole matrix; a sharded parameter keeps the rows of its outer chunk
      // (every rank draws the same whole Q from an identically seeded generator).
      const Layout L = dist_ ? dist_->layout(p) : Layout{p.sizes().vec(), -1, false};
      const QRows q = q_rows_of(L, axis_place(dist_.get()));  // src/optim/state_layout.h
      const int64_t r = math::dion_rank(L.global_shape[0], L.global_shape[1], o.rank_fraction(), o.rank_multiple_of());
      at::Tensor Q = at::randn({q.rows, r}, p.options().dtype(o.Q_dtype().value_or(p.scalar_type())));
      if (L.sharded()) Q = Q.narrow(0, q.start, q.length).clone();
      s->Q(Q);
    }
    slot = std::move(s);
  }
  return static_cast<ParamState&>(*slot);
}

void Optimizer::init_state() {
  if (dist_) {  // collective: every rank calls init_state
    dist_->prepare();
    check_ranks_agree(*dist_, param_groups_, agreed_);
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    for (const at::Tensor& p : group.params()) state_for(p, o);
  }
}

// ---------------------------------------------------------------------------- step

at::Tensor Optimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  if (dist_) {
    dist_->prepare();                                // collective, on every rank, before any task runs
    check_ranks_agree(*dist_, param_groups_, agreed_);  // src/optim/agreement.h
  }
  // A parameter with no elements (a [16, 0] matrix; not an empty shard of a non-empty one,
  // which takes part in its collectives) has nothing to update: skipped, same on every rank.
  auto globally_empty = [this](const at::Tensor& p) {
    const std::vector<int64_t> shape = dist_ ? dist_->layout(p).global_shape : p.sizes().vec();
    return std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end();
  };

  // One task per megabatch of a matrix group and one per scalar group, in the reference's
  // order: matrix groups first, then lion, then adamw. Every task's state is created here, on
  // this thread, so the tasks below only read the state map.
  struct Task {
    std::function<void()> run;
    bool draws_random = false;  // legacy Dion: its random draws stay in task order
  };
  std::vector<Task> tasks;
  for (const char* phase : {"matrix", "lion", "adamw"}) {
    for (auto& group : param_groups_) {
      auto& o = static_cast<Options&>(group.options());
      const std::string& algo = o.algorithm();
      const bool mine = std::string(phase) == "matrix" ? is_matrix_algorithm(algo) : algo == phase;
      if (!mine) continue;
      o.step(o.step() + 1);
      std::vector<at::Tensor> live;
      for (const at::Tensor& p : group.params())
        if (p.grad().defined() && !globally_empty(p)) live.push_back(p);
      if (live.empty()) continue;
      for (const at::Tensor& p : live) state_for(p, o);
      const size_t index = static_cast<size_t>(&group - param_groups_.data());
      const Options* opts = &o;
      if (algo == "lion") {
        tasks.push_back({[this, live, opts] { step_lion(live, *opts); }});
      } else if (algo == "adamw") {
        tasks.push_back({[this, live, opts] { step_adamw(live, *opts); }});
      } else {
        for (auto& batch : megabatches(live, dist_.get())) {
          if (algo == "muon" || algo == "normuon")
            tasks.push_back({[this, batch, opts, index] { step_muon_like(batch, *opts, index); }});
          else if (algo == "dion2" || algo == "nordion2")
            tasks.push_back({[this, batch, opts, index] { step_dion2_like(batch, *opts, index); }});
          else
            tasks.push_back({[this, batch, opts] { step_dion(batch, *opts); }, true});
        }
      }
    }
  }
  run_tasks(tasks);
  return loss;
}

// Up to Distribution::tasks_in_flight() tasks in flight, all on this thread (dion/comm/tasks.h):
// a task that waits for a collective yields to the others in a fixed order, so every rank issues
// the same collectives in the same order on one group while one task's communication overlaps
// another's computation. Tasks that draw random numbers run one after another, in order.
template <typename TaskList>
void Optimizer::run_tasks(TaskList& tasks) {
  std::vector<comm::Task> list;
  list.reserve(tasks.size());
  for (auto& t : tasks) list.push_back({std::move(t.run), t.draws_random});
  comm::run_tasks(list, dist_ ? dist_->tasks_in_flight() : 1);
}

// ---------------------------------------------------------------------------- megabatch plan

// How one megabatch is laid out: whole and local, replicated across a group (DDP), or sharded
// along one tensor dim (FSDP). Mirrors the reference's _get_shard_info / megabatch paths.
struct Optimizer::Plan {
  Layout layout;
  int64_t heads = 0;        // > 1: per-head views, orthogonalized where they are
  bool communicate = false;  // false: orthogonalize the local tensors as they are
  int64_t comm_dim = 0;      // sharded: negative tensor dim the shards concatenate along
  int64_t world = 1;
  bool row_sharded() const { return communicate && comm_dim == -2; }
};

void Optimizer::set_distribution(std::shared_ptr<Distribution> distribution) {
  dist_ = std::move(distribution);
  agreed_.clear();
  for (size_t g = 0; g < param_groups_.size(); ++g)
    check_group(g, param_groups_[g].params(), static_cast<const Options&>(param_groups_[g].options()));
}

Optimizer::Plan Optimizer::plan_for(const std::vector<at::Tensor>& batch, const Options& o,
                                    size_t g) const {
  Plan plan;
  const at::Tensor& p = batch[0];
  plan.layout = dist_ ? dist_->layout(p) : Layout{p.sizes().vec(), -1, false};
  plan.world = dist_ ? dist_->world_size() : 1;
  plan.heads = o.num_heads() > 1 ? o.num_heads() : 0;
  const Layout& L = plan.layout;
  const int64_t ndim = static_cast<int64_t>(L.global_shape.size());
  const std::string where = "param group " + std::to_string(g) + " (" + o.algorithm() + "), shape " +
                            shape_str(L.global_shape);
  if (plan.heads) {
    // Whole heads on every rank: orthogonalize locally (the reference does the same).
    if (L.two_d())
      throw NotImplementedError(where + ": num_heads with 2-D (FSDP x TP) sharding is not supported");
    if (L.sharded()) {
      if (L.shard_dim != 0)
        throw NotImplementedError(where + ": num_heads needs sharding on dim 0 (the heads dim) or none; "
                                  "sharded on dim " + std::to_string(L.shard_dim));
      if (plan.heads % plan.world != 0)
        throw ValueError(where + ": num_heads (" + std::to_string(plan.heads) +
                         ") must be divisible by the sharding world size (" + std::to_string(plan.world) +
                         ") so each rank holds whole heads");
    }
    return plan;
  }
  if (L.sharded()) {
    const bool matrix_dim = L.shard_dim >= ndim - 2;
    if (!o.flatten() && !matrix_dim && !L.two_d()) return plan;  // batch-sharded 3-D+: whole matrices here
    if (L.two_d() && o.flatten())
      throw NotImplementedError(where + ": flatten with 2-D (FSDP x TP) sharding is not supported");
    plan.communicate = true;
    plan.comm_dim = L.shard_dim - ndim;
    const std::string& a = o.algorithm();
    if ((a == "normuon" || a == "nordion2") && plan.comm_dim == -1)
      throw NotImplementedError(where + ": '" + a + "' does not support parameters sharded along the last "
                                "dimension (per-neuron statistics need whole rows); shard dim 0 instead");
    if (!o.split_sizes().empty()) {
      if (plan.comm_dim == -2 && L.global_shape[ndim - 2] % plan.world != 0)
        throw NotImplementedError(where + ": split_sizes requires dim 0 (" +
                                  std::to_string(L.global_shape[ndim - 2]) +
                                  ") to be divisible by the sharding world size (" + std::to_string(plan.world) +
                                  ") so the assembled matrices have no interspersed padding rows");
      if (a == "normuon")
        throw NotImplementedError(where + ": normuon with split_sizes on sharded parameters is not supported");
    }
    return plan;
  }
  plan.communicate = L.replicated && batch.size() > 1;  // DDP: split the megabatch across ranks
  return plan;
}

at::Tensor Optimizer::orthogonalize(std::vector<at::Tensor> U, const Plan& plan, const Options& o,
                                    const math::OrthoFn& fn, const std::vector<int64_t>& split_sizes,
                                    const std::vector<double>& split_scales, int64_t local_size) {
  const bool flatten = o.flatten();
  const double eps = o.epsilon();
  auto apply = [&fn, flatten, eps, &split_sizes, &split_scales](const at::Tensor& stacked) {
    return math::orthogonalize_megabatch(stacked, fn, flatten, eps, split_sizes, split_scales);
  };
  if (!plan.communicate || !dist_) {
    // One parameter: orthogonalize it as it is (the reference's N == 1 path); several: one stack.
    at::Tensor stacked = U.size() == 1 ? U[0].unsqueeze(0) : at::stack(U, 0);
    return apply(stacked);
  }
  OrthoRequest request;
  request.apply = apply;
  request.comm_dim = plan.comm_dim;
  if (plan.layout.sharded()) {
    const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
    request.global_size = plan.layout.global_shape[ndim + plan.comm_dim];
  }
  request.local_size = local_size;
  return dist_->orthogonalize(std::move(U), plan.layout, request);
}

// ---------------------------------------------------------------------------- the algorithms

// A megabatch's tensors as the math sees them — per-head views [H, hd, n] when num_heads is
// set — and the shape its learning rate is adjusted for (the global shape, or one head).
Optimizer::Operands Optimizer::operands(const std::vector<at::Tensor>& batch, const Options& o, const Plan& plan,
                                        bool with_variance) {
  Operands ops;
  ops.X = batch;
  ops.G = gradients(batch);
  for (const at::Tensor& p : batch) {
    ParamState& s = state_for(p, o);
    ops.M.push_back(s.momentum());
    if (with_variance) ops.V.push_back(s.variance_neuron());
  }
  ops.adjust_shape = plan.layout.global_shape;
  if (plan.heads) {
    const int64_t head_dim = plan.layout.global_shape[0] / plan.heads;
    ops.X = head_views(ops.X, head_dim);
    ops.G = head_views(ops.G, head_dim);
    ops.M = head_views(ops.M, head_dim);
    if (with_variance) ops.V = head_views(ops.V, head_dim);
    ops.adjust_shape = ops.X[0].sizes().vec();
  }
  return ops;
}

void Optimizer::step_muon_like(const std::vector<at::Tensor>& params, const Options& o, size_t g) {
  const bool nor = o.algorithm() == "normuon";
  for (const auto& batch : megabatches(params, dist_.get())) {
    const Plan plan = plan_for(batch, o, g);
    auto [X, G, M, V, adjust_shape] = operands(batch, o, plan, nor);
    std::vector<double> scales;  // split_sizes excludes num_heads: adjust_shape is the global shape
    if (!o.split_sizes().empty())
      scales = math::split_lr_scales(o.split_sizes(), adjust_shape, o.adjust_lr());
    std::vector<at::Tensor> U = math::muon_pre(G, M, f32(o.mu()), o.nesterov(), ortho_.dtype);
    at::Tensor O = orthogonalize(std::move(U), plan, o, ortho_fn_, o.split_sizes(), scales);
    if (nor) {
      math::ShardSum reduce;
      if (plan.row_sharded()) reduce = [this](at::Tensor& t) { dist_->sum_over_shards_(t); };
      // Sharded or not, each rank normalizes the rows it holds (per-neuron statistics are local,
      // summed over the column blocks under 2-D sharding).
      const std::vector<int64_t> splits = plan.layout.sharded() ? std::vector<int64_t>{} : o.split_sizes();
      auto [normed, V_new] = math::normuon_normalize(O, at::stack(V, 0), f32(o.muon_beta2()), splits, reduce,
                                                     column_shards(plan));
      std::vector<at::Tensor> V_parts = V_new.unbind(0);
      for (size_t i = 0; i < V.size(); ++i) V[i].copy_(V_parts[i]);
      O = normed;
    }
    const float lr = f32(o.lr());
    const float adj = math::adjusted_lr(lr, o.adjust_lr(), adjust_shape, o.flatten());
    math::muon_post(X, O.unbind(0), lr, adj, f32(o.weight_decay()), o.cautious_wd());
  }
}

void Optimizer::step_dion2_like(const std::vector<at::Tensor>& params, const Options& o, size_t g) {
  const bool nor = o.algorithm() == "nordion2";
  for (const auto& batch : megabatches(params, dist_.get())) {
    const Plan plan = plan_for(batch, o, g);
    auto [X, G, M, V, adjust_shape] = operands(batch, o, plan, nor);
    const bool matrix_sharded = plan.communicate && plan.layout.sharded();
    // NorDion2 selects rows (per-neuron statistics need whole rows). Dion2 selects along the
    // shorter dim, as one process does (selection_dim "shorter"), or along the sharded dim as
    // the reference does ("shard"; also what 2-D (FSDP x TP) and 3-D+ sharded matrices do).
    const bool across_shards_ok = matrix_sharded && !plan.layout.two_d() && adjust_shape.size() == 2;
    int64_t select_dim;
    if (nor) select_dim = -2;
    else if (matrix_sharded && (o.selection_dim() == "shard" || !across_shards_ok) &&
             (plan.comm_dim == -2 || plan.comm_dim == -1))
      select_dim = plan.comm_dim;
    else select_dim = math::dion2_select_dim(adjust_shape[adjust_shape.size() - 2], adjust_shape.back());
    const float ef = f32(nor ? o.mu() : o.ef_decay());
    const float lr = f32(o.lr());
    const float adj = math::adjusted_lr(lr, o.adjust_lr(), adjust_shape, o.flatten());
    math::ShardSum reduce;
    if (matrix_sharded && plan.comm_dim == -2) reduce = [this](at::Tensor& t) { dist_->sum_over_shards_(t); };

    if (across_shards_ok && select_dim != plan.comm_dim) {
      // Selecting along the unsharded dim (tall row-sharded, wide column-sharded): every slice
      // is split across the shards; partial L1 norms summed over them give every rank the
      // single-process top-k, each rank keeps its part of the selected slices [.., local, k],
      // and the submatrix is assembled along the sharded dim. Either selection scope: the
      // selection is whole-matrix and the traffic scales with `fraction`.
      math::ShardSum sum_norms = [this](at::Tensor& t) { dist_->sum_over_shards_(t); };
      math::Selection sel = math::dion2_pre(G, M, o.fraction(), ef, select_dim, ortho_.dtype, 0, sum_norms);
      at::Tensor O = orthogonalize(std::move(sel.U), plan, o, ortho_fn_, {}, {});
      math::dion2_post(X, O.unbind(0), sel.indices, lr, adj, f32(o.weight_decay()), select_dim);
      continue;
    }
    if (matrix_sharded && (o.selection_scope() == "global" || plan.layout.two_d()) &&
        adjust_shape.size() == 2 && select_dim == plan.comm_dim) {
      dion2_exact_global(X, G, M, V, plan, o, select_dim, adj);
      continue;
    }
    if (matrix_sharded && o.selection_scope() == "global") {
      // 3-D+ sharded matrices: whole shards travel and the exact top-k is taken on the
      // assembled matrices (the reference's global scope).
      const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
      const int64_t global_select = plan.layout.global_shape[ndim + select_dim];
      std::vector<at::Tensor> U = math::dion2_accumulate(G, M, ortho_.dtype);
      math::OrthoFn select = math::dion2_select_then(ortho_fn_, o.fraction(), select_dim, global_select);
      at::Tensor O = orthogonalize(std::move(U), plan, o, select, {}, {});
      std::vector<at::Tensor> Us = O.unbind(0);
      if (nor)
        math::nordion2_post_masked(X, M, V, Us, lr, adj, f32(o.weight_decay()), ef, f32(o.muon_beta2()), reduce);
      else
        math::dion2_post_masked(X, M, Us, lr, adj, f32(o.weight_decay()), ef, select_dim);
      continue;
    }
    // Local selection: every rank picks the same count k of its own slices.
    int64_t k = 0;
    if (matrix_sharded) {
      const int64_t ndim = static_cast<int64_t>(plan.layout.global_shape.size());
      const int64_t global = plan.layout.global_shape[ndim + plan.comm_dim];
      k = math::dion2_num_selected(o.fraction(), (global + plan.world - 1) / plan.world);
    }
    math::Selection sel = math::dion2_pre(G, M, o.fraction(), ef, select_dim, ortho_.dtype, k);
    at::Tensor O = orthogonalize(std::move(sel.U), plan, o, ortho_fn_, {}, {}, k);
    if (nor) {
      auto [normed, V_new] = math::nordion2_normalize_selected(O, at::stack(V, 0), at::stack(sel.indices, 0),
                                                               f32(o.muon_beta2()), reduce);
      std::vector<at::Tensor> V_parts = V_new.unbind(0);
      for (size_t i = 0; i < V.size(); ++i) V[i].copy_(V_parts[i]);
      O = normed;
    }
    math::dion2_post(X, O.unbind(0), sel.indices, lr, adj, f32(o.weight_decay()), select_dim);
  }
}

// Dion2 / NorDion2 "global" selection on 2-D matrices sharded along the selection dim.
//
// The reference sends whole shards and selects on the assembled (bf16) matrices. Here each rank
// computes the float32 L1 norms of its own slices (a slice along the sharded dim is whole on one
// rank), one all_gather of those norms gives every rank the exact whole-matrix top-k, and only
// the selected slices travel (padded to the largest per-rank count). The selection equals the
// single-process one, and communication scales with `fraction` as in the local scope.
void Optimizer::dion2_exact_global(const std::vector<at::Tensor>& X, const std::vector<at::Tensor>& G,
                                   const std::vector<at::Tensor>& M, const std::vector<at::Tensor>& V,
                                   const Plan& plan, const Options& o, int64_t select_dim, float adj) {
  const bool nor = o.algorithm() == "nordion2";
  const int64_t W = plan.world, r = dist_->rank();
  const int64_t N = static_cast<int64_t>(X.size());
  const int64_t norm_dim = select_dim == -2 ? -1 : -2;
  const int64_t global = plan.layout.global_shape[2 + select_dim];
  const int64_t padded = (global + W - 1) / W;
  const int64_t k = std::min(math::dion2_num_selected(o.fraction(), global), global);

  for (int64_t i = 0; i < N; ++i) M[i].add_(G[i].to(M[i].scalar_type()));  // M += G
  at::Tensor norms = at::linalg_vector_norm(at::stack(M, 0), 1, at::IntArrayRef{norm_dim}, false);  // [N, local]
  dist_->sum_over_inner_(norms);  // 2-D sharding: add the other column blocks' partial L1 norms
  at::Tensor padded_norms = at::full({N, padded}, -std::numeric_limits<float>::infinity(), norms.options());
  padded_norms.narrow(1, 0, norms.size(1)).copy_(norms);
  at::Tensor all = dist_->gather_over_shards(padded_norms);                     // [W, N, padded]
  at::Tensor global_norms = all.permute({1, 0, 2}).reshape({N, W * padded});    // rank-major slices
  at::Tensor gidx = std::get<1>(at::topk(global_norms, k, -1, true, false));    // [N, k]
  at::Tensor owner = at::div(gidx, padded, "floor"), local = gidx.remainder(padded);

  int64_t k_pad = 0;  // the most slices any rank contributes to any matrix (same on every rank)
  for (int64_t w = 0; w < W; ++w) k_pad = std::max(k_pad, (owner == w).sum(-1).max().item<int64_t>());
  std::vector<at::Tensor> idx(N), U(N);
  const float ef = static_cast<float>(nor ? o.mu() : o.ef_decay());
  for (int64_t i = 0; i < N; ++i) {
    idx[i] = local[i].masked_select(owner[i] == r);                  // my selected slices, top-k order
    at::Tensor sel = M[i].index_select(select_dim, idx[i]);          // [c, n] or [m, c]
    M[i].index_copy_(select_dim, idx[i], sel * scalar32(ef));  // error feedback
    std::vector<int64_t> shape = M[i].sizes().vec();
    shape[2 + select_dim] = k_pad;
    U[i] = at::zeros(shape, M[i].options().dtype(ortho_.dtype));
    U[i].narrow(select_dim, 0, idx[i].size(0)).copy_(sel);
  }
  at::Tensor O = orthogonalize(std::move(U), plan, o, ortho_fn_, {}, {}, k_pad);  // [N, k_pad | ..]
  if (nor) {
    std::vector<at::Tensor> Vsel;
    for (int64_t i = 0; i < N; ++i) {
      at::Tensor v = at::zeros({k_pad, 1}, V[i].options().dtype(at::kFloat));
      v.narrow(0, 0, idx[i].size(0)).copy_(V[i].index_select(0, idx[i]));
      Vsel.push_back(v);
    }
    math::ShardSum reduce = [this](at::Tensor& t) { dist_->sum_over_shards_(t); };
    auto [normed, V_new] = math::normuon_normalize(O, at::stack(Vsel, 0), f32(o.muon_beta2()), {}, reduce,
                                                   column_shards(plan));
    for (int64_t i = 0; i < N; ++i)
      V[i].index_copy_(0, idx[i], V_new[i].narrow(0, 0, idx[i].size(0)).to(V[i].scalar_type()));
    O = normed;
  }
  const float lr = f32(o.lr());
  const at::Tensor decay = scalar32(1.0f - lr * f32(o.weight_decay()));
  const at::Tensor neg_lr = scalar32(-adj);
  for (int64_t i = 0; i < N; ++i) {
    X[i].mul_(decay);
    at::Tensor u = O[i].narrow(select_dim, 0, idx[i].size(0)).to(X[i].scalar_type()) * neg_lr;
    X[i].index_add_(select_dim, idx[i], u);
  }
}

void Optimizer::step_dion(const std::vector<at::Tensor>& params, const Options& o) {
  for (const auto& batch : megabatches(params, dist_.get())) {
    std::vector<at::Tensor> G = grads_of(batch), M, Q;
    for (const at::Tensor& p : batch) {
      ParamState& s = state_for(p, o);
      M.push_back(s.momentum());
      Q.push_back(s.Q());
    }
    const Layout layout = dist_ ? dist_->layout(batch[0]) : Layout{batch[0].sizes().vec(), -1, false};
    if (layout.sharded()) {
      step_dion_sharded(batch, G, M, Q, layout, o);
      continue;
    }
    if (!dist_ || !layout.replicated) {
      math::dion_step(batch, G, M, Q, f32(o.lr()), f32(o.mu()), f32(o.weight_decay()), f32(o.epsilon()),
                      f32(o.oversample()));
      continue;
    }
    // DDP. With optimizer-side gradient sync, average the low-rank P and R instead of the
    // gradient when that moves fewer bytes: (m + n) r < m n (the reference's rule).
    const int64_t m = batch[0].size(0), n = batch[0].size(1);
    const int64_t r = Q[0].size(1);
    const bool sync = dist_->sync_gradients();
    const bool compressed = sync && o.rank_fraction() < 1.0 && (m + n) * r < m * n;
    if (sync && !compressed) {
      for (at::Tensor& g : G) {
        g = g.clone(at::MemoryFormat::Contiguous);
        dist_->average_over_replicas_(g);
      }
    }
    math::DionBatch b = math::dion_power(G, M, Q);
    at::Tensor P = b.P.contiguous();
    if (compressed) dist_->average_over_replicas_(P);
    // Each rank orthonormalizes ceil(N / W) of the batch; one all_gather shares the results.
    const int64_t W = dist_->world_size(), rank = dist_->rank(), N = P.size(0);
    const int64_t per_rank = (N + W - 1) / W;
    at::Tensor padded = N == per_rank * W ? P : at::cat({P, at::zeros({per_rank * W - N, P.size(1), P.size(2)}, P.options())});
    at::Tensor mine = math::dion_orthonormalize(padded.narrow(0, rank * per_rank, per_rank), f32(o.oversample()));
    P = dist_->gather_over_shards(mine.contiguous()).flatten(0, 1).narrow(0, 0, N);
    at::Tensor R = math::dion_R(b, P).contiguous();
    if (compressed) dist_->average_over_replicas_(R);
    math::dion_finish(batch, M, Q, b, P, R, f32(o.lr()), f32(o.mu()), f32(o.weight_decay()), f32(o.epsilon()));
  }
}

math::ColumnShards Optimizer::column_shards(const Plan& plan) const {
  if (!plan.layout.two_d()) return {};
  math::ColumnShards cols;
  cols.sum_over_columns = [this](at::Tensor& t) { dist_->sum_over_inner_(t); };
  cols.columns = plan.layout.global_shape.back();
  return cols;
}

std::vector<at::Tensor> Optimizer::gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> G = grads_of(params);
  if (!dist_ || !dist_->sync_gradients()) return G;
  for (size_t i = 0; i < G.size(); ++i) {
    // FSDP gradients arrive reduce-scattered over the shard group; HSDP averages them over the
    // replicate group.
    if (dist_->layout(params[i]).sharded() && dist_->axis_size(Axis::REPLICA) <= 1) continue;
    G[i] = G[i].clone(at::MemoryFormat::Contiguous);
    dist_->average_over_replicas_(G[i]);
  }
  return G;
}

// Legacy Dion on FSDP (outer) or FSDP x TP (outer x inner) shards, after the reference's
// dion_update_fsdp / dion_update_fsdp_tp. M_batch [a, b] is M or M^T with the outer-sharded dim
// as b (so Q [b, r] is sharded like it) and the inner-sharded dim, if any, as a.
//   P = M Q: partial over outer -> summed (reduce-scatter in 1-D, all_reduce in 2-D)
//   orthonormalize P: 1-D: each outer rank ~N/W matrices, then all_gather; 2-D: P's rows are
//     gathered over inner and every rank orthonormalizes all of them with a sketch generator
//     seeded identically everywhere (no further communication; every rank gets the same P)
//   R = M^T P: partial over inner -> all_reduce; column norms of R summed over outer.
// With a replicate group and optimizer-side sync: P and R are averaged over it when compressed
// ((m + n) r < m n), otherwise the gradients are.
void Optimizer::step_dion_sharded(const std::vector<at::Tensor>& X, std::vector<at::Tensor> G,
                                  const std::vector<at::Tensor>& M, const std::vector<at::Tensor>& Q,
                                  const Layout& L, const Options& o) {
  const int64_t m = L.global_shape[0], n = L.global_shape[1];
  const bool transposed = math::dion_is_transposed_sharded(m, n, L.shard_dim, L.inner_dim);
  const int64_t r = Q[0].size(1);
  const bool sync = dist_->sync_gradients() && dist_->axis_size(Axis::REPLICA) > 1;
  const bool compressed = sync && o.rank_fraction() < 1.0 && (m + n) * r < m * n;
  if (sync && !compressed)
    for (at::Tensor& g : G) {
      g = g.clone(at::MemoryFormat::Contiguous);
      dist_->average_over_replicas_(g);
    }
  math::DionBatch b = math::dion_power(G, M, Q, transposed ? 1 : 0);
  at::Tensor P = b.P.contiguous();  // [N, a_local, r], partial over outer
  const int64_t N = P.size(0), W = dist_->axis_size(Axis::OUTER);
  const float oversample = f32(o.oversample());
  if (!L.two_d()) {
    // Reduce-scatter over outer (one all_to_all + a local sum), orthonormalize my share, gather.
    const int64_t per = (N + W - 1) / W;
    at::Tensor padded = N == per * W ? P : at::cat({P, at::zeros({per * W - N, P.size(1), r}, P.options())});
    at::Tensor mine = dist_->all_to_all(padded, Axis::OUTER).view({W, per, P.size(1), r}).sum(0);
    if (compressed) dist_->average_over_replicas_(mine);
    mine = math::dion_orthonormalize(mine, oversample);
    P = dist_->all_gather(mine.contiguous(), Axis::OUTER).flatten(0, 1).narrow(0, 0, N);
  } else {
    dist_->all_reduce_(P, Axis::OUTER);
    if (compressed) dist_->average_over_replicas_(P);
    const int64_t T = dist_->axis_size(Axis::INNER), a = transposed ? n : m;
    const int64_t chunk = (a + T - 1) / T, a_local = P.size(1);
    at::Tensor pad = a_local == chunk ? P : at::cat({P, at::zeros({N, chunk - a_local, r}, P.options())}, 1);
    at::Tensor all = dist_->all_gather(pad.contiguous(), Axis::INNER);          // [T, N, chunk, r]
    at::Tensor full = all.permute({1, 0, 2, 3}).reshape({N, T * chunk, r}).narrow(1, 0, a);
    // The sketch generator lives on P's device (a CPU generator into a CUDA normal_ is refused).
    at::Generator gen = math::dion_sketch_generator(
        full.device(), static_cast<uint64_t>(o.step()) * 1000003ULL + static_cast<uint64_t>(a) * 131ULL +
                           static_cast<uint64_t>(r));
    full = math::dion_orthonormalize(full.contiguous(), oversample, gen);
    const int64_t t = dist_->axis_rank(Axis::INNER), start = std::min(a, chunk * t);
    P = full.narrow(1, start, a_local).contiguous();
  }
  at::Tensor R = math::dion_R(b, P).contiguous();  // [N, b_local, r]
  if (L.two_d()) dist_->all_reduce_(R, Axis::INNER);
  if (compressed) dist_->average_over_replicas_(R);
  math::dion_finish(X, M, Q, b, P, R, f32(o.lr()), f32(o.mu()), f32(o.weight_decay()), f32(o.epsilon()),
                    L.global_shape, [this](at::Tensor& t) { dist_->all_reduce_(t, Axis::OUTER); });
}

void Optimizer::synchronize_for_checkpoint() {
  if (!dist_ || !dist_->sync_gradients()) return;
  at::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    for (const at::Tensor& p : group.params()) {
      ParamState* s = state_of(p);
      if (!s) continue;
      for (at::Tensor t : {s->momentum(), s->variance(), s->variance_neuron(), s->Q()}) {
        if (!t.defined()) continue;
        at::Tensor avg = t.to(at::kFloat).contiguous();
        dist_->average_over_replicas_(avg);
        t.copy_(avg);
      }
    }
  }
}

void Optimizer::step_adamw(const std::vector<at::Tensor>& params, const Options& o) {
  std::vector<at::Tensor> G = gradients(params), M, V, steps;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    ParamState& s = state_for(p, o);
    G[i] = G[i].to(p.scalar_type());
    M.push_back(s.momentum());
    V.push_back(s.variance());
    steps.push_back(s.step_dev());
  }
  const auto [b1, b2] = o.betas();
  math::adamw_update(params, G, M, V, steps,
                     {f32(o.lr()), f32(b1), f32(b2), f32(o.weight_decay()), f32(o.epsilon()), o.cautious_wd()});
}

void Optimizer::step_lion(const std::vector<at::Tensor>& params, const Options& o) {
  std::vector<at::Tensor> M;
  for (const at::Tensor& p : params) M.push_back(state_for(p, o).momentum());
  const auto [b1, b2] = o.betas();
  math::lion_update(params, gradients(params), M, {f32(o.lr()), f32(b1), f32(b2), f32(o.weight_decay()), o.cautious_wd()});
}

// ---------------------------------------------------------------------------- named classes

Options Muon::defaults() { return Options(0.01).algorithm("muon"); }
Muon::Muon(const std::vector<ParamGroup>& groups, const Options& d, math::OrthoConfig ortho,
            std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), d, "muon", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Options NorMuon::defaults() { return Options(0.01).algorithm("normuon"); }
NorMuon::NorMuon(const std::vector<ParamGroup>& groups, const Options& d, math::OrthoConfig ortho,
                  std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), d, "normuon", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Options Dion2::defaults() { return Options(0.01).algorithm("dion2"); }
Dion2::Dion2(const std::vector<ParamGroup>& groups, const Options& d, math::OrthoConfig ortho,
              std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), d, "dion2", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Options NorDion2::defaults() { return Options(0.01).algorithm("nordion2"); }
NorDion2::NorDion2(const std::vector<ParamGroup>& groups, const Options& d, math::OrthoConfig ortho,
                    std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), d, "nordion2", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Options Dion::defaults() { return Options(0.01).algorithm("dion"); }
Dion::Dion(const std::vector<ParamGroup>& groups, const Options& d, std::shared_ptr<Distribution> distribution)
    : Optimizer(math::OrthoConfig{}, d, "dion", std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

}  // namespace dion
