// The optimizer: grouping, state, megabatching, task scheduling and dispatch to the algorithms'
// updates, all through their specs (dion/optim/algorithm.h). See include/dion/optim/optimizer.h.
// Not here: the algorithms (src/optim/drivers/: their specs and updates), the megabatch plans (dion/optim/plan.h), the
// communication patterns (dion/optim/collectives.h), checkpoints (checkpoint.cpp), the math (src/math/).
#include "dion/optim/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <sstream>

#ifdef DION_HAVE_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

#include "dion/comm/tasks.h"
#include "agreement.h"
#include "dion/math/own_kernels.h"
#include "dion/optim/collectives.h"
#include "dion/optim/driver.h"
#include "dion/optim/plan.h"
#include "state_layout.h"

namespace dion {

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
template <typename LayoutOf>
std::vector<std::vector<at::Tensor>> megabatches(const std::vector<at::Tensor>& params, bool distributed,
                                                 const LayoutOf& layout_of_param) {
  std::vector<std::vector<at::Tensor>> out;
  using Key =
      std::tuple<std::vector<int64_t>, at::ScalarType, std::vector<int64_t>, int64_t, int64_t, const AxisGroup*>;
  std::map<Key, size_t> index;
  for (const at::Tensor& p : params) {
    Key key{p.sizes().vec(), p.scalar_type(), {}, -1, -1, nullptr};
    if (distributed) {
      const Layout& L = layout_of_param(p);
      std::get<2>(key) = L.global_shape;
      std::get<3>(key) = L.shard_dim;
      std::get<4>(key) = L.inner_dim;
      std::get<5>(key) = L.group;  // an expert stack is not batched with an FSDP shard of its shape
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

}  // namespace

// ---------------------------------------------------------------------------- construction

Optimizer::Optimizer(math::OrthoConfig ortho, const Options& defaults, std::optional<Algorithm> only_algorithm,
                     std::shared_ptr<Distribution> distribution)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, std::make_unique<Options>(defaults)),
      ortho_(std::move(ortho)),
      ortho_fn_(ortho_.function()),
      only_algorithm_(only_algorithm),
      dist_(std::move(distribution)) {
  defaults.validate(0);
}

Optimizer::Optimizer(const std::vector<ParamGroup>& groups, const Options& defaults, math::OrthoConfig ortho,
                     std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), defaults, std::nullopt, std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

Optimizer::Optimizer(std::vector<at::Tensor> params, const Options& defaults, math::OrthoConfig ortho,
                     std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), defaults, std::nullopt, std::move(distribution)) {
  add_group_checked(std::move(params), defaults);
}

void Optimizer::add_param_group(const ParamGroup& group) {
  add_group_checked(group.params, group.options.apply(static_cast<const Options&>(defaults())));
}

void Optimizer::add_group_checked(std::vector<at::Tensor> params, Options options) {
  const size_t index = param_groups_.size();
  options.validate(index);
  check_group(index, params, options);
  for (const at::Tensor& p : params) shapes_[p.unsafeGetTensorImpl()] = p.sizes().vec();
  torch::optim::Optimizer::add_param_group(
      torch::optim::OptimizerParamGroup(std::move(params), std::make_unique<Options>(options)));
}

void Optimizer::check_group(size_t g, const std::vector<at::Tensor>& params, const Options& o) const {
  const Algorithm algo = o.algo();
  const AlgorithmSpec& spec = algo.spec();
  const std::string where = "param group " + std::to_string(g) + " (" + o.algorithm() + ")";
  if (only_algorithm_ && algo != *only_algorithm_ && algo.matrix()) {
    std::string scalars;
    for (Algorithm a : algorithms())
      if (!a.matrix()) scalars += (scalars.empty() ? "'" : " and '") + a.name() + "'";
    throw ValueError(where + ": this optimizer runs '" + only_algorithm_->name() + "' matrix groups plus " + scalars +
                     " groups; use dion::Optimizer to mix matrix algorithms");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    // A shard is checked as the whole parameter it is part of.
    const std::vector<int64_t> shape = layout_of(dist_.get(), p).global_shape;
    const std::string what = where + ", parameter " + std::to_string(i) + " of shape " + shape_str(shape);
    if (!p.is_floating_point()) throw TypeError(what + ": parameters must be floating point");
    if (p.is_meta())
      throw ValueError(what +
                       ": is on the meta device (it has no data): materialize the model (to_empty(), then "
                       "load or initialize its weights) before building the optimizer");
    if (p.device() != params[0].device())
      throw ValueError(what + ": is on " + p.device().str() + " but parameter 0 of the group is on " +
                       params[0].device().str() +
                       ": the parameters of one group must be on one device; move them, or put them in separate "
                       "groups");
    if (spec.matrix && p.dim() < 2) {
      std::string scalars;
      for (Algorithm a : algorithms())
        if (!a.matrix()) scalars += (scalars.empty() ? "an '" : "' or '") + a.name();
      throw ValueError(what + ": '" + o.algorithm() +
                       "' needs matrix parameters (ndim >= 2); put vectors and scalars in " + scalars + "' group");
    }
    if (spec.check_param) spec.check_param(ParamView{p, shape, dist_.get()}, o, what);
    if (o.num_heads() > 1 && spec.matrix) {
      if (p.dim() != 2) throw ValueError(what + ": num_heads is only supported for 2-D parameters");
      if (shape[0] % o.num_heads() != 0)
        throw ValueError(what + ": num_heads (" + std::to_string(o.num_heads()) + ") must divide dim 0 (" +
                         std::to_string(shape[0]) + ")");
    }
    if (!o.split_sizes().empty() && spec.matrix) {
      if (p.dim() != 2) throw ValueError(what + ": split_sizes is only supported for 2-D parameters");
      int64_t total = 0;
      for (int64_t s : o.split_sizes()) total += s;
      if (total != shape[0])
        throw ValueError(what + ": split_sizes sum to " + std::to_string(total) + " but must sum to dim 0 (" +
                         std::to_string(shape[0]) + ")");
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
  if (o.algo() != current.algo())
    for (const at::Tensor& p : param_groups_[group].params()) state_.erase(p.unsafeGetTensorImpl());
  current = o;
}

ParamState* Optimizer::state_of(const at::Tensor& param) {
  auto it = state_.find(param.unsafeGetTensorImpl());
  return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
}

// ---------------------------------------------------------------------------- device scalars

namespace {
// Is the current stream of `device` capturing a CUDA graph? (Never for CPU tensors.)
bool capturing(const at::Device& device) {
#ifdef DION_HAVE_CUDA
  if (device.is_cuda()) return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#endif
  (void)device;
  return false;
}
}  // namespace

void Optimizer::set_device_scalars(bool on) {
  device_scalars_on_ = on;
  if (on) refresh_device_scalars();
}

const DeviceScalars& Optimizer::device_scalars_of(size_t group) const {
  TORCH_CHECK(group < param_groups_.size(), "no param group ", group, " (have ", param_groups_.size(), ")");
  static const DeviceScalars kNone;
  return group < device_scalars_.size() ? device_scalars_[group] : kNone;
}

void Optimizer::refresh_device_scalars() {
  if (!device_scalars_on_) return;
  device_scalars_.resize(param_groups_.size());
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    if (params.empty()) continue;
    const at::Device device = params[0].device();
    DeviceScalars& d = device_scalars_[g];
    if (capturing(device))
      throw ValueError("param group " + std::to_string(g) +
                       ": the lr / weight decay tensors cannot be filled while a CUDA graph is being captured (the "
                       "fill would be captured with this step's values); call refresh_device_scalars() before "
                       "capturing or replaying");
    if (!d.lr.defined() || d.lr.device() != device) {  // allocated once per device, then filled in place
      const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
      d.lr = at::empty({}, opts);
      d.weight_decay = at::empty({}, opts);
    }
    const auto& o = static_cast<const Options&>(param_groups_[g].options());
    d.lr.fill_(static_cast<double>(static_cast<float>(o.lr())));
    d.weight_decay.fill_(static_cast<double>(static_cast<float>(o.weight_decay())));
  }
}

// ---------------------------------------------------------------------------- state

std::vector<StateSpec> Optimizer::state_specs(const at::Tensor& p, const Options& o) const {
  const std::vector<int64_t> global = layout_of(dist_.get(), p).global_shape;
  return o.spec().state(ParamView{p, global, dist_.get()}, o);
}

ParamState& Optimizer::state_for(const at::Tensor& p, const Options& o) {
  auto& slot = state_[p.unsafeGetTensorImpl()];
  if (!slot) {
    at::NoGradGuard no_grad;
    auto s = std::make_unique<ParamState>();
    const std::vector<int64_t> global = layout_of(dist_.get(), p).global_shape;
    const ParamView view{p, global, dist_.get()};
    const AlgorithmSpec& spec = o.spec();
    for (const StateSpec& st : spec.state(view, o)) {  // zeros unless the spec says otherwise
      at::Tensor t;
      if (spec.initial_state) t = spec.initial_state(view, st);
      if (!t.defined()) {
        // The parameter's shape: zeros_like keeps its strides (a non-contiguous parameter's too).
        const auto options = p.options().dtype(st.dtype);
        t = c10::IntArrayRef(st.shape) == p.sizes() ? at::zeros_like(p, options) : at::zeros(st.shape, options);
      }
      s->set(st.key, std::move(t));
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

void Optimizer::check_shapes_unchanged() const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      auto it = shapes_.find(p.unsafeGetTensorImpl());
      if (it != shapes_.end() && p.sizes() != c10::IntArrayRef(it->second))
        throw ValueError("param group " + std::to_string(g) + ", parameter " + std::to_string(i) + ": its shape is " +
                         shape_str(p.sizes()) + " but was " + shape_str(it->second) +
                         " when the optimizer was built (resized since?): its state has the old shape; build a new "
                         "optimizer over the resized parameter");
      if (p.grad().defined() && p.grad().sizes() != p.sizes())
        throw ValueError("param group " + std::to_string(g) + ", parameter " + std::to_string(i) + " of shape " +
                         shape_str(p.sizes()) + ": its gradient has shape " + shape_str(p.grad().sizes()) +
                         "; a gradient must have its parameter's shape");
    }
  }
}

at::Tensor Optimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  // This optimizer's OrthoConfig::cuda_kernels turns the own CUDA kernels on for its step
  // (dion/math/own_kernels.h); otherwise the process-wide setting holds.
  std::optional<math::OwnCudaKernelsScope> own_kernels;
  if (ortho_.cuda_kernels) own_kernels.emplace(true);
  check_shapes_unchanged();  // before any collective: the same parameters on every rank
  if (device_scalars_on_) {
    // Filled from the groups' Options, except under CUDA-graph capture (filled before it).
    bool under_capture = false;
    for (const auto& group : param_groups_)
      if (!group.params().empty() && capturing(group.params()[0].device())) under_capture = true;
    if (!under_capture) {
      refresh_device_scalars();
    } else if (device_scalars_.size() != param_groups_.size()) {
      throw ValueError(
          "device scalars were not filled before the CUDA-graph capture of step(); call "
          "refresh_device_scalars() first");
    }
  }
  if (dist_) {
    dist_->prepare();                                   // collective, on every rank, before any task runs
    check_ranks_agree(*dist_, param_groups_, agreed_);  // src/optim/agreement.h
  }
  // Each parameter's layout, asked once this step (megabatches, empty checks and plans share it).
  std::unordered_map<const c10::TensorImpl*, Layout> layouts;
  auto layout = [&](const at::Tensor& p) -> const Layout& {
    auto it = layouts.find(p.unsafeGetTensorImpl());
    if (it == layouts.end()) it = layouts.emplace(p.unsafeGetTensorImpl(), layout_of(dist_.get(), p)).first;
    return it->second;
  };
  // A parameter with no elements (a [16, 0] matrix; not an empty shard of a non-empty one,
  // which takes part in its collectives) has nothing to update: skipped, same on every rank.
  auto globally_empty = [&](const at::Tensor& p) {
    const std::vector<int64_t>& shape = layout(p).global_shape;
    return std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end();
  };

  // One task per megabatch of a matrix group and one per scalar group, in the reference's
  // order: matrix groups first, then lion, then adamw. Every task's state is created here, on
  // this thread, so the tasks below only read the state map.
  const Collectives comm(dist_.get());
  const driver::Env env{&comm, &ortho_, &ortho_fn_, device_scalars_on_ ? &device_scalars_ : nullptr};
  std::vector<comm::Task> tasks;
  // A matrix megabatch's plan is made here, on this thread, before any task runs: a layout the
  // algorithm refuses throws before any algorithm's collective of this step. prepare()'s and the
  // ranks' agreement check's collectives have run by then (above): the ranks hold the same
  // layouts and communication options, so every rank refuses alike.
  const int64_t world = dist_ ? dist_->world_size() : 1;
  // A stack split on a matrix dim over its own group (shard_over on dim -2 or -1: an expert
  // stack whose experts are split over EP and whose rows are split by FSDP over another group,
  // registered as this EP rank's experts) is assembled over that group as FSDP shards are over
  // the outer one: its megabatches see a Distribution whose outer axis is that group (no inner,
  // no replicas), through their own Collectives. Built here, for this step; every rank builds
  // the same ones in the same order.
  std::map<const AxisGroup*, std::pair<std::shared_ptr<Distribution>, std::unique_ptr<Collectives>>> over_own;
  auto add_task = [&](std::vector<at::Tensor> params, size_t index, const Options* opts) {
    driver::Batch batch{std::move(params), {}, index};
    driver::Env task_env = env;
    if (opts->spec().matrix) {
      Layout L = layout(batch.params[0]);
      int64_t w = world;
      if (L.own_group() && L.shard_dim >= static_cast<int64_t>(L.global_shape.size()) - 2) {
        auto& own = over_own[L.group];
        if (!own.first) {
          own.first = std::make_shared<Distribution>(std::shared_ptr<AxisGroup>(std::shared_ptr<void>(), L.group));
          own.second = std::make_unique<Collectives>(own.first.get());
        }
        w = L.group->size();
        L.group = nullptr;
        task_env.comm = own.second.get();
      }
      batch.plan = plan_for(L, w, batch.params.size(), *opts, index);
    }
    for (const at::Tensor& p : batch.params) batch.state.push_back(&state_for(p, *opts));
    const AlgorithmSpec::Update run = opts->spec().update;
    // Algorithms that draw random numbers keep their draws in order (serial tasks).
    tasks.push_back(
        {[run, batch = std::move(batch), opts, task_env] { run(batch, *opts, task_env); }, opts->spec().serial});
  };
  // The phases in order (AlgorithmSpec::phase: the reference runs matrix groups, then lion,
  // then adamw), each group in its own phase.
  std::vector<int> phases;
  for (const auto& group : param_groups_) phases.push_back(static_cast<const Options&>(group.options()).spec().phase);
  std::sort(phases.begin(), phases.end());
  phases.erase(std::unique(phases.begin(), phases.end()), phases.end());
  for (const int phase : phases) {
    for (auto& group : param_groups_) {
      auto& o = static_cast<Options&>(group.options());
      if (o.spec().phase != phase) continue;
      std::vector<at::Tensor> live;
      for (const at::Tensor& p : group.params())
        if (p.grad().defined() && !globally_empty(p)) live.push_back(p);
      if (live.empty()) continue;
      for (const at::Tensor& p : live) state_for(p, o);  // in the group's order (random initial state)
      const size_t index = static_cast<size_t>(&group - param_groups_.data());
      if (o.spec().matrix)
        for (auto& batch : megabatches(live, dist_ != nullptr, layout)) add_task(std::move(batch), index, &o);
      else
        add_task(std::move(live), index, &o);
    }
  }
  // Every plan is made: the groups' step counts move on (the tasks read them when they run).
  for (auto& group : param_groups_) {
    auto& o = static_cast<Options&>(group.options());
    o.step(o.step() + 1);
  }
  // Up to Distribution::tasks_in_flight() tasks in flight, all on this thread
  // (dion/comm/tasks.h): a task that waits for a collective yields to the others in a fixed
  // order, so every rank issues the same collectives in the same order on one group while one
  // task's communication overlaps another's computation. Tasks that draw random numbers run one
  // after another, in order.
  comm::run_tasks(tasks, dist_ ? dist_->tasks_in_flight() : 1);
  return loss;
}

void Optimizer::set_distribution(std::shared_ptr<Distribution> distribution) {
  dist_ = std::move(distribution);
  agreed_.clear();
  for (size_t g = 0; g < param_groups_.size(); ++g)
    check_group(g, param_groups_[g].params(), static_cast<const Options&>(param_groups_[g].options()));
}

void Optimizer::synchronize_for_checkpoint() {
  if (!dist_ || !dist_->sync_gradients()) return;
  at::NoGradGuard no_grad;
  const bool replica_axis = dist_->axis_size(Axis::REPLICA) > 1;
  for (auto& group : param_groups_) {
    for (const at::Tensor& p : group.params()) {
      ParamState* s = state_of(p);
      if (!s) continue;
      if (!replica_axis && dist_->layout(p).own_group()) continue;  // experts differ across the outer group
      for (const auto& [key, t] : s->tensors()) {
        if (!t.defined() || t.dim() == 0) continue;  // 0-d: counters, equal on every replica
        at::Tensor avg = t.to(at::kFloat).contiguous();
        dist_->average_over_replicas_(avg);
        t.copy_(avg);
      }
    }
  }
}

// ---------------------------------------------------------------------------- one algorithm's class

Options NamedOptimizer::defaults_of(const std::string& name) {
  const Algorithm a = find_algorithm(name);
  if (!a) throw ValueError("no algorithm '" + name + "' (registered: " + algorithm_names() + ")");
  return Options().algorithm(a);
}

NamedOptimizer::NamedOptimizer(const std::string& name, const std::vector<ParamGroup>& groups, const Options& d,
                               math::OrthoConfig ortho, std::shared_ptr<Distribution> distribution)
    : Optimizer(std::move(ortho), d, defaults_of(name).algo(), std::move(distribution)) {
  for (const ParamGroup& g : groups) add_param_group(g);
}

}  // namespace dion
