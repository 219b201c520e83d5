// src/train/parallel/fsdp.cpp — FSDP's runtime (fsdp.h): the fs all_gathers of the weights (kept,
// prefetched by unit, or re-gathered in backward), bf16 gathers, deferred gradient sync, and the
// gradient reduce-scatter. An MoE expert stack under EP x FSDP goes the same way over its efs
// group along dim 0.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <stdexcept>

#include "dion/comm/chunks.h"
#include "dion/train/autocast.h"
#include "dion/train/fsdp.h"
#include "detail.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using namespace detail;

namespace {

// FSDP's gather of a parameter: forward returns `gathered` (the fs all_gather of `local`, done by
// the caller, possibly prefetched or kept from an earlier micro-batch); backward hands the
// gathered weight's gradient to Fsdp::reduce_gradient (reduce-scatter to `local`, or summed
// locally while gradient sync is off).
struct FsGatherFn : torch::autograd::Function<FsGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, const at::Tensor& gathered, int64_t fsdp,
                            int64_t key) {
    ctx->saved_data["fsdp"] = fsdp;
    ctx->saved_data["key"] = key;
    (void)local;
    return gathered;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Fsdp& fsdp = fsdp_of(ctx->saved_data["fsdp"]);
    return {fsdp.reduce_gradient(from_key(ctx->saved_data["key"]), grads[0]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// FSDP with reshard_after_forward: y = x W^T with W [out, in] the fs-gather of `local`, given
// as `full` (gathered by the caller); saves x and `local` only, gathers W again in backward,
// dW handed to Fsdp::reduce_gradient as FsGatherFn's. The backward computes what
// at::linear's autograd computes (mm's backward formulas: dx = dy W, dW = dy^T x over the
// flattened leading dims) or, with `fast` (fp32 Kernels::fast), the same three oneDNN GEMMs as
// the kept-weight linear (kernels.h linear_forward / linear_dx / linear_dw), so the gradients
// are the kept-weight run's bit for bit.
struct GatheredLinearFn : torch::autograd::Function<GatheredLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& local, const at::Tensor& full,
                            int64_t fsdp, int64_t key, bool fast) {
    ctx->save_for_backward({x, local});
    ctx->saved_data["fsdp"] = fsdp;
    ctx->saved_data["key"] = key;
    ctx->saved_data["fast"] = fast;
    // [.., out]; `full` is freed when the caller drops it
    return linear_forward(x, full, fast ? Kernels::fast : Kernels::exact);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Fsdp& fsdp = fsdp_of(ctx->saved_data["fsdp"]);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];            // [.., in]
    at::Tensor w = fsdp.regathered(saved[1]);  // [out, in]
    const Kernels kind = ctx->saved_data["fast"].toBool() ? Kernels::fast : Kernels::exact;
    at::Tensor dx = linear_dx(grads[0], w, x.sizes(), kind);  // [.., in]
    at::Tensor dw = linear_dw(grads[0], x, kind);             // [out, in]
    return {dx,           fsdp.reduce_gradient(from_key(ctx->saved_data["key"]), dw),
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool Fsdp::gathered(const Placement& pl) const { return (pl.fs_dim >= 0 && mesh_.shape().fs > 1) || pl.efs > 1; }

// fs, or efs for an expert stack under EP x FSDP (along its ep_dim).
comm::Group& Fsdp::group(const Placement& pl) const { return *mesh_.group(pl.efs > 1 ? Axis::efs : Axis::fs); }

int64_t Fsdp::dim(const Placement& pl) const { return pl.efs > 1 ? pl.ep_dim : pl.fs_dim; }

int64_t Fsdp::gathered_length(const Placement& pl) const {
  return pl.efs > 1 ? pl.global_shape[pl.ep_dim] / mesh_.shape().ep : pl.global_shape[pl.fs_dim];
}

comm::Work Fsdp::gather_async(const at::Tensor& param, const Placement& pl) {
  at::Tensor shard = param.detach();
  if (shard.is_floating_point() && gather_dtype_ != shard.scalar_type()) shard = shard.to(gather_dtype_);
  return comm::gather_tensor_async(group(pl), shard, dim(pl), gathered_length(pl));
}

at::Tensor Fsdp::gathered_now(Prefetch& pf, const at::Tensor& param, const Placement& pl) {
  ++pf.gathers;
  const void* key = param.unsafeGetTensorImpl();
  const int64_t d = dim(pl), global = gathered_length(pl);
  // A bf16 gather (gather_dtype_) is computed with in the parameter's dtype.
  auto join = [&](const at::Tensor& all) { return comm::join_gathered(all, d, global).to(param.scalar_type()); };
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
        pf.inflight[pf.order[k]] = gather_async(p, placements_.of(p));
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

at::Tensor Fsdp::regathered(const at::Tensor& param) { return gathered_now(bwd_, param, placements_.of(param)); }

at::Tensor Fsdp::weight(const at::Tensor& param, const Placement& pl) {
  const void* key = param.unsafeGetTensorImpl();
  at::Tensor full;  // the whole weight along fs_dim (an expert stack: this ep rank's experts)
  if (auto it = kept_.find(key); it != kept_.end()) {
    full = it->second;  // gathered by an earlier micro-batch of this step
  } else {
    full = gathered_now(fwd_, param, pl);
    if (!sync_) kept_.emplace(key, full);
  }
  return FsGatherFn::apply(param, full, int64_t(reinterpret_cast<intptr_t>(this)), key_handle(param));
}

at::Tensor Fsdp::resharded_linear(const at::Tensor& x, const at::Tensor& param, const Placement& pl, Kernels kernels) {
  // As the reference: the blocks' weights only (wte / lm_head: reshard_after_forward=False).
  if (!(reshard_after_forward_ && pl.fs_dim >= 0 && mesh_.shape().fs > 1 && !pl.tp_gather &&
        unit_of(pl.name) != pl.name))
    return at::Tensor();
  return GatheredLinearFn::apply(x, param, gathered_now(fwd_, param, pl), int64_t(reinterpret_cast<intptr_t>(this)),
                                 key_handle(param),
                                 /*fast=*/kernels == Kernels::fast && !autocast_dtype(x.device().type()));
}

void Fsdp::set_requires_gradient_sync(bool on) {
  if (sync_ && !on) {  // a new accumulation window
    if (!grad_sum_.empty())
      throw std::logic_error(
          "parallel layout: gradient sync turned off again before the summed gradients were reduce-scattered");
    kept_.clear();  // nothing is left after a synced backward; never reuse weights of an earlier step
  }
  sync_ = on;
}

at::Tensor Fsdp::reduce_gradient(const void* key, const at::Tensor& grad) {
  // Deferred sync (fast_fsdp's micro-batches before the last): the gradient of the gathered
  // weight is summed here at full size — one whole gradient per gathered weight lives across
  // the micro-batches of a step, next to the kept gathered weights (the reference's fast_fsdp:
  // the entire unsharded model and its gradients in memory during accumulation).
  auto it = grad_sum_.find(key);
  if (!sync_) {
    if (it == grad_sum_.end())
      grad_sum_.emplace(key, grad.contiguous().clone());  // [.., global, ..]
    else
      it->second.add_(grad);
    return at::Tensor();  // the parameter gets no gradient from this micro-batch
  }
  at::Tensor sum = grad;
  if (it != grad_sum_.end()) {
    sum = it->second.add_(grad);  // the micro-batches' sum, in micro-batch order
    grad_sum_.erase(it);
  }
  kept_.erase(key);  // reshard after the synced backward
  const Placement& pl = placements_.of(key);
  ++reduce_scatters_;
  return comm::reduce_scatter(group(pl), sum, dim(pl));
}

}  // namespace dion::train
