// src/train/parallel.cpp — the mesh, parameter placement, the FSDP / TP autograd functions and
// the DDP gradient buckets (parallel.h).
#include "dion/train/parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dion/dist/distributed.h"
#include "dion/train/autocast.h"
#include "dion/train/config.h"

namespace dion::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Groups travel through the autograd context as integers (the Parallel object outlives every
// backward pass of its model).
int64_t to_handle(comm::Group* g) { return int64_t(reinterpret_cast<intptr_t>(g)); }
comm::Group& from_handle(const at::IValue& v) { return *reinterpret_cast<comm::Group*>(intptr_t(v.toInt())); }

// `full` [.., global, ..] (global along `dim`) -> this rank's chunk of the sum over the group's
// ranks: a reduce-scatter, as one all_to_all of zero-padded chunks and a sum in rank order.
at::Tensor reduce_scatter(comm::Group& g, const at::Tensor& full, int64_t dim) {
  const int W = g.size();
  const int64_t global = full.size(dim);
  const int64_t chunk = (global + W - 1) / W;
  at::Tensor x = full.movedim(dim, 0);  // [global, ...]
  if (W * chunk != global) {
    std::vector<int64_t> pad = x.sizes().vec();
    pad[0] = W * chunk - global;
    x = at::cat({x, at::zeros(pad, x.options())}, 0);
  }
  x = x.contiguous();
  std::vector<int64_t> split = x.sizes().vec();
  split[0] = chunk;
  split.insert(split.begin(), W);
  at::Tensor parts = g.all_to_all(x).view(split);  // [W, chunk, ...]: part i from rank i
  const dist::Chunk mine = dist::shard_range(global, W, g.rank());
  return parts.sum(0).narrow(0, 0, mine.length).movedim(0, dim).contiguous();
}

// The key of a parameter (its TensorImpl, as Parallel's maps) through the autograd context.
int64_t key_handle(const at::Tensor& param) { return int64_t(reinterpret_cast<intptr_t>(param.unsafeGetTensorImpl())); }
const void* from_key(const at::IValue& v) { return reinterpret_cast<const void*>(intptr_t(v.toInt())); }
Parallel& parallel_of(const at::IValue& v) { return *reinterpret_cast<Parallel*>(intptr_t(v.toInt())); }

// FSDP's gather of a parameter: forward returns `gathered` (the fs all_gather of `local`, done by
// the caller, possibly prefetched or kept from an earlier micro-batch); backward hands the
// gathered weight's gradient to Parallel::fs_reduce_gradient (reduce-scatter to `local`, or
// summed locally while gradient sync is off).
struct FsGatherFn : torch::autograd::Function<FsGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, const at::Tensor& gathered, int64_t parallel,
                            int64_t key) {
    ctx->saved_data["parallel"] = parallel;
    ctx->saved_data["key"] = key;
    (void)local;
    return gathered;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Parallel& par = parallel_of(ctx->saved_data["parallel"]);
    return {par.fs_reduce_gradient(from_key(ctx->saved_data["key"]), grads[0]), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// TP's gather for replicated compute (wte, lm_head): forward returns `gathered` (the tp
// all_gather of `local` along `dim`); backward keeps this rank's chunk of the gradient, which is
// identical on every rank of the group.
struct TpGatherFn : torch::autograd::Function<TpGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, const at::Tensor& gathered, int64_t group,
                            int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    (void)local;
    return gathered;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::Group& g = from_handle(ctx->saved_data["group"]);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const dist::Chunk c = dist::shard_range(grads[0].size(dim), g.size(), g.rank());
    return {grads[0].narrow(dim, c.start, c.length).contiguous(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// FSDP with reshard_after_forward: y = x W^T with W [out, in] the fs-gather of `local`, given
// as `full` (gathered by the caller); saves x and `local` only, gathers W again in backward,
// dW handed to Parallel::fs_reduce_gradient as FsGatherFn's. The backward computes what
// at::linear's autograd computes (mm's backward formulas: dx = dy W, dW = dy^T x over the
// flattened leading dims) or, with `fast` (fp32 Kernels::fast), the same three oneDNN GEMMs as
// the kept-weight linear (kernels.h linear_forward / linear_dx / linear_dw), so the gradients
// are the kept-weight run's bit for bit.
struct GatheredLinearFn : torch::autograd::Function<GatheredLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& local, const at::Tensor& full,
                            int64_t parallel, int64_t key, bool fast) {
    ctx->save_for_backward({x, local});
    ctx->saved_data["parallel"] = parallel;
    ctx->saved_data["key"] = key;
    ctx->saved_data["fast"] = fast;
    // [.., out]; `full` is freed when the caller drops it
    return linear_forward(x, full, fast ? Kernels::fast : Kernels::exact);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Parallel& par = parallel_of(ctx->saved_data["parallel"]);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];                                        // [.., in]
    at::Tensor w = par.regathered(saved[1]);                               // [out, in]
    const Kernels kind = ctx->saved_data["fast"].toBool() ? Kernels::fast : Kernels::exact;
    at::Tensor dx = linear_dx(grads[0], w, x.sizes(), kind);  // [.., in]
    at::Tensor dw = linear_dw(grads[0], x, kind);             // [out, in]
    return {dx, par.fs_reduce_gradient(from_key(ctx->saved_data["key"]), dw), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// The FSDP unit a parameter belongs to: "transformer.h.<i>." for a block's, else its own name.
std::string unit_of(const std::string& name) {
  const std::string pre = "transformer.h.";
  if (name.rfind(pre, 0) != 0) return name;
  return name.substr(0, name.find('.', pre.size()) + 1);
}

// Identity forward; the gradient summed over the TP group in backward.
struct TpEnterFn : torch::autograd::Function<TpEnterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0].contiguous().clone();
    from_handle(ctx->saved_data["group"]).all_reduce_(g);
    return {g, at::Tensor()};
  }
};

// Sum over the TP group forward; identity backward.
struct TpExitFn : torch::autograd::Function<TpExitFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t group) {
    at::Tensor y = x.contiguous().clone();
    reinterpret_cast<comm::Group*>(intptr_t(group))->all_reduce_(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

// ---------------------------------------------------------------------------- placement

ParamPlacement placement_of(const std::string& name, const std::vector<int64_t>& global_shape, const MeshShape& m) {
  ParamPlacement p{name, global_shape};
  const bool column = ends_with(name, "attn.c_q.weight") || ends_with(name, "attn.c_k.weight") ||
                      ends_with(name, "attn.c_v.weight") || ends_with(name, "mlp.c_fc.weight");
  const bool row = ends_with(name, "c_proj.weight");
  const bool vocab = ends_with(name, "wte.weight") || ends_with(name, "lm_head.weight");
  if (!column && !row && !vocab)
    throw std::logic_error("parallel layout: no placement for parameter '" + name + "'");
  if (m.tp > 1) {
    p.tp_dim = row ? 1 : 0;
    p.tp_gather = vocab;
  }
  if (m.fs > 1) p.fs_dim = m.tp > 1 ? (row ? 0 : 1) : 0;
  return p;
}

at::Tensor local_part(const at::Tensor& full, const ParamPlacement& p, int fs_size, int fs_rank, int tp_size,
                      int tp_rank) {
  at::Tensor t = full;
  if (p.tp_dim >= 0) t = dist::shard_tensor(t, p.tp_dim, tp_size, tp_rank);
  if (p.fs_dim >= 0) t = dist::shard_tensor(t, p.fs_dim, fs_size, fs_rank);
  return t.contiguous();
}

Box local_box(const ParamPlacement& p, int fs_size, int fs_rank, int tp_size, int tp_rank) {
  Box b{std::vector<int64_t>(p.global_shape.size(), 0), p.global_shape};
  if (p.tp_dim >= 0) {
    const dist::Chunk c = dist::shard_range(b.length[p.tp_dim], tp_size, tp_rank);
    b.start[p.tp_dim] += c.start;
    b.length[p.tp_dim] = c.length;
  }
  if (p.fs_dim >= 0) {
    const dist::Chunk c = dist::shard_range(b.length[p.fs_dim], fs_size, fs_rank);
    b.start[p.fs_dim] += c.start;
    b.length[p.fs_dim] = c.length;
  }
  return b;
}

// ---------------------------------------------------------------------------- Parallel

Parallel::Parallel(comm::Group world, MeshShape shape) : world_(std::move(world)), shape_(shape) {
  if (shape_.world() != world_.size())
    throw ConfigError(fmt::format("dp_size {} x fs_size {} x tp_size {} = {}, but WORLD_SIZE is {}: the product of "
                                  "the mesh sizes must equal the number of processes",
                                  shape_.dp, shape_.fs, shape_.tp, shape_.world(), world_.size()));
  mesh_ = std::make_unique<comm::DeviceMesh>(
      world_, std::vector<std::pair<std::string, int>>{{"dp", int(shape_.dp)}, {"fs", int(shape_.fs)}, {"tp", int(shape_.tp)}});
  dp_ = mesh_->axis("dp");
  fs_ = mesh_->axis("fs");
  tp_ = mesh_->axis("tp");
  data_ = mesh_->flatten({"dp", "fs"});
}

int Parallel::data_rank() const { return int(mesh_->coordinate("dp") * shape_.fs + mesh_->coordinate("fs")); }

void Parallel::place(GPT& model) {
  placements_.clear();
  ordered_.clear();
  for (auto& item : model->named_parameters()) {
    const at::Tensor& p = item.value();
    ParamPlacement pl = placement_of(item.key(), p.sizes().vec(), shape_);
    if (pl.tp_dim >= 0 && !pl.tp_gather && p.size(pl.tp_dim) % shape_.tp != 0)
      throw ConfigError(fmt::format("parameter '{}' has {} along dim {}, not divisible by tp_size {}", item.key(),
                                    p.size(pl.tp_dim), pl.tp_dim, shape_.tp));
    placements_[p.unsafeGetTensorImpl()] = pl;
    ordered_.push_back(pl);
  }
}

void Parallel::shard_model(GPT& model) {
  at::NoGradGuard no_grad;
  place(model);
  if (shape_.world() == 1) return;
  for (auto& item : model->named_parameters()) {
    at::Tensor& p = item.value();
    // A copy, so that the whole tensor is freed.
    p.set_data(local_part(p, placement(p), fs_->size(), fs_->rank(), tp_->size(), tp_->rank()).clone());
  }
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

void Parallel::init_model(GPT& model) {
  place(model);
  std::unordered_map<std::string, const ParamPlacement*> by_name;
  for (const ParamPlacement& pl : ordered_) by_name[pl.name] = &pl;
  if (shape_.world() == 1) {
    model->init_weights();
    return;
  }
  model->init_weights([&](const std::string& name, const at::Tensor& full) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw std::logic_error("parallel layout: init_weights drew an unknown parameter '" + name + "'");
    return local_part(full, *it->second, fs_->size(), fs_->rank(), tp_->size(), tp_->rank()).clone();
  });
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

const ParamPlacement& Parallel::placement(const at::Tensor& param) const {
  auto it = placements_.find(param.unsafeGetTensorImpl());
  if (it == placements_.end()) throw std::logic_error("parallel layout: a parameter that shard_model did not place");
  return it->second;
}

std::shared_ptr<Distribution> Parallel::distribution(GPT& model, bool optimizer_syncs_gradients) const {
  if (shape_.world() == 1) return nullptr;
  std::shared_ptr<dist::Distributed> d;
  if (shape_.tp > 1) {
    d = std::make_shared<dist::Distributed>(fs_, tp_);
  } else if (shape_.fs > 1) {
    d = std::make_shared<dist::Distributed>(fs_);
  } else {
    return std::make_shared<dist::Distributed>(dp_, optimizer_syncs_gradients);  // DDP
  }
  if (shape_.dp > 1) d->replicate(dp_, optimizer_syncs_gradients);
  for (auto& item : model->named_parameters()) {
    const ParamPlacement& pl = placement(item.value());
    if (shape_.tp > 1) {
      // 2-D: outer (fs) dim = the one tp does not split, even when fs is 1.
      d->shard(item.value(), pl.global_shape, pl.tp_dim == 0 ? 1 : 0, pl.tp_dim);
    } else {
      d->shard(item.value(), pl.global_shape, pl.fs_dim);
    }
  }
  return d;
}

int64_t Parallel::bytes_sent() const {
  return world_.stats().total_bytes();  // one ledger per process: every sub-group counts into the world's
}

comm::Work Parallel::gather_async(const at::Tensor& param, const ParamPlacement& pl) {
  at::Tensor shard = param.detach();
  if (shard.is_floating_point() && gather_dtype_ != shard.scalar_type()) shard = shard.to(gather_dtype_);
  return dist::gather_tensor_async(*fs_, shard, pl.fs_dim, pl.global_shape[pl.fs_dim]);
}

at::Tensor Parallel::fs_gathered(Prefetch& pf, const at::Tensor& param, const ParamPlacement& pl) {
  ++pf.gathers;
  const void* key = param.unsafeGetTensorImpl();
  const int64_t dim = pl.fs_dim, global = pl.global_shape[dim];
  // A bf16 gather (gather_dtype_) is computed with in the parameter's dtype.
  auto join = [&](const at::Tensor& all) { return dist::join_gathered(all, dim, global).to(param.scalar_type()); };
  auto now = [&] { return join(gather_async(param, pl).wait()); };
  if (!pf.recorded) {  // the first pass: record the order
    if (pf.order.empty() || key != pf.order[0]) {
      pf.order.push_back(key);
      pf.unit.push_back(unit_of(pl.name));
      pf.param[key] = param;
      return now();
    }
    pf.recorded = true;
  }
  const size_t n = pf.order.size();
  if (key == pf.order[0]) pf.pos = 0;  // a pass begins
  if (pf.pos >= n || pf.order[pf.pos] != key) {
    // A pass that differs from the recorded one (the same on every rank): no prefetch until the
    // next begins; what is in flight is waited (in recorded order) and dropped.
    for (const void* k : pf.order)
      if (auto it = pf.inflight.find(k); it != pf.inflight.end()) it->second.wait();
    pf.inflight.clear();
    pf.pos = n;
    return now();
  }
  if (pf.pos == 0 || pf.unit[pf.pos] != pf.unit[pf.pos - 1]) {
    // The first weight of a unit: issue the next unit's gathers before this unit computes.
    size_t next = pf.pos + 1;
    while (next < n && pf.unit[next] == pf.unit[pf.pos]) ++next;
    for (size_t k = next; k < n && pf.unit[k] == pf.unit[next]; ++k)
      if (!pf.inflight.count(pf.order[k])) {
        const at::Tensor& p = pf.param.at(pf.order[k]);
        pf.inflight[pf.order[k]] = gather_async(p, placement(p));
      }
  }
  ++pf.pos;
  if (auto it = pf.inflight.find(key); it != pf.inflight.end()) {
    at::Tensor all = it->second.wait();
    pf.inflight.erase(it);
    ++pf.prefetched;
    return join(all);
  }
  return now();
}

at::Tensor Parallel::regathered(const at::Tensor& param) { return fs_gathered(bwd_, param, placement(param)); }

at::Tensor Parallel::weight(const at::Tensor& param) {
  const ParamPlacement& pl = placement(param);
  at::Tensor w = param;
  if (pl.fs_dim >= 0 && fs_->size() > 1) {
    const void* key = param.unsafeGetTensorImpl();
    at::Tensor full;  // the whole weight along fs_dim
    if (auto it = kept_.find(key); it != kept_.end()) {
      full = it->second;  // gathered by an earlier micro-batch of this step
    } else {
      full = fs_gathered(fwd_, param, pl);
      if (!sync_) kept_.emplace(key, full);
    }
    w = FsGatherFn::apply(w, full, int64_t(reinterpret_cast<intptr_t>(this)), key_handle(param));
  }
  if (pl.tp_gather && tp_->size() > 1) {
    at::Tensor full = dist::gather_tensor(*tp_, w.detach(), pl.tp_dim, pl.global_shape[pl.tp_dim]);
    w = TpGatherFn::apply(w, full, to_handle(tp_.get()), pl.tp_dim);
  }
  return w;
}

at::Tensor Parallel::linear(const at::Tensor& x, const at::Tensor& param) {
  const ParamPlacement& pl = placement(param);
  // As the reference: the blocks' weights only (wte / lm_head: reshard_after_forward=False).
  if (reshard_after_forward_ && pl.fs_dim >= 0 && fs_->size() > 1 && !pl.tp_gather && unit_of(pl.name) != pl.name)
    return GatheredLinearFn::apply(x, param, fs_gathered(fwd_, param, pl), int64_t(reinterpret_cast<intptr_t>(this)),
                                   key_handle(param),
                                   /*fast=*/kernels == Kernels::fast && !autocast_dtype(x.device().type()));
  return ModelParallel::linear(x, param);
}

void Parallel::set_requires_gradient_sync(bool on) {
  if (sync_ && !on) {  // a new accumulation window
    if (!grad_sum_.empty())
      throw std::logic_error(
          "parallel layout: gradient sync turned off again before the summed gradients were reduce-scattered");
    kept_.clear();  // nothing is left after a synced backward; never reuse weights of an earlier step
  }
  sync_ = on;
}

at::Tensor Parallel::fs_reduce_gradient(const void* key, const at::Tensor& grad) {
  // Deferred sync (fast_fsdp's micro-batches before the last): the gradient of the gathered
  // weight is summed here at full size — one whole gradient per gathered weight lives across
  // the micro-batches of a step, next to the kept gathered weights (the reference's fast_fsdp:
  // the entire unsharded model and its gradients in memory during accumulation).
  auto it = grad_sum_.find(key);
  if (!sync_) {
    if (it == grad_sum_.end()) grad_sum_.emplace(key, grad.contiguous().clone());  // [.., global, ..]
    else it->second.add_(grad);
    return at::Tensor();  // the parameter gets no gradient from this micro-batch
  }
  at::Tensor sum = grad;
  if (it != grad_sum_.end()) {
    sum = it->second.add_(grad);  // the micro-batches' sum, in micro-batch order
    grad_sum_.erase(it);
  }
  kept_.erase(key);  // reshard after the synced backward
  auto pl = placements_.find(key);
  if (pl == placements_.end())
    throw std::logic_error("parallel layout: a gradient for a parameter that shard_model did not place");
  ++reduce_scatters_;
  return reduce_scatter(*fs_, sum, pl->second.fs_dim);
}

at::Tensor Parallel::tp_enter(const at::Tensor& x) {
  return tp_->size() > 1 ? TpEnterFn::apply(x, to_handle(tp_.get())) : x;
}

at::Tensor Parallel::tp_exit(const at::Tensor& x) {
  return tp_->size() > 1 ? TpExitFn::apply(x, to_handle(tp_.get())) : x;
}

// ---------------------------------------------------------------------------- GradSync

namespace {
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradSync* s, size_t i) : sync(s), index(i) {}
  void operator()(const torch::autograd::Variable&) override { sync->ready(index); }
  GradSync* sync;
  size_t index;
};
}  // namespace

GradSync::GradSync(std::shared_ptr<comm::Group> group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(std::move(group)), params_(std::move(params)) {
  // Buckets in reverse registration order: backward produces the last layers' gradients first.
  bucket_of_.assign(params_.size(), 0);
  int64_t fill = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t bytes = params_[k].numel() * int64_t(params_[k].element_size());
    if (buckets_.empty() || (fill > 0 && fill + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      fill = 0;
    }
    buckets_.back().members.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    fill += bytes;
  }
  for (size_t k = 0; k < params_.size(); ++k)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k], std::make_unique<ReadyHook>(this, k));
}

GradSync::~GradSync() {
  for (at::Tensor& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
}

void GradSync::arm() {
  armed_ = true;
  next_launch_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = b.members.size();
    b.launched = false;
    b.work = comm::Work();
  }
}

void GradSync::ready(size_t index) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[index]];
  if (b.pending > 0) --b.pending;
  launch_ready_prefix();
}

void GradSync::launch_ready_prefix() {
  // Strictly in bucket order, so that every rank issues the same all_reduces in the same order
  // whatever order its hooks fire in.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(buckets_[next_launch_++]);
}

void GradSync::launch(Bucket& b) {
  std::vector<at::Tensor> grads;
  for (size_t k : b.members) {
    const at::Tensor& g = params_[k].grad();
    grads.push_back(g.defined() ? g.reshape({-1}) : at::zeros({params_[k].numel()}, params_[k].options()));
  }
  b.flat = at::cat(grads);  // [sum of numels]
  b.work = group_->all_reduce_async(b.flat);
  b.launched = true;
}

void GradSync::finish() {
  if (!armed_) throw std::logic_error("GradSync::finish without arm()");
  launched_in_backward_ = int64_t(next_launch_);
  for (Bucket& b : buckets_) b.pending = 0;  // parameters without a gradient this step: zeros
  launch_ready_prefix();
  at::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    at::Tensor flat = b.work.wait();
    int64_t off = 0;
    for (size_t k : b.members) {
      at::Tensor& p = params_[k];
      const int64_t n = p.numel();
      at::Tensor sum = flat.narrow(0, off, n).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(sum);
      else p.mutable_grad() = sum.clone();
      off += n;
    }
    b.flat = at::Tensor();
  }
  armed_ = false;
}

}  // namespace dion::train
