// src/train/parallel/tp.cpp — tensor parallelism's autograd functions (parallel.h): the gather of wte /
// lm_head for replicated compute, and the enter / exit of a TP region (identity one way, a sum
// over the tp group the other).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "dion/comm/chunks.h"
#include "dion/train/parallel.h"
#include "detail.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using namespace detail;

namespace {

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
    const comm::Chunk c = comm::shard_range(grads[0].size(dim), g.size(), g.rank());
    return {grads[0].narrow(dim, c.start, c.length).contiguous(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

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

at::Tensor detail::tp_gathered(comm::Group& tp, const at::Tensor& w, const Placement& pl) {
  at::Tensor full = comm::gather_tensor(tp, w.detach(), pl.tp_dim, pl.global_shape[pl.tp_dim]);
  return TpGatherFn::apply(w, full, to_handle(&tp), pl.tp_dim);
}

at::Tensor Parallel::tp_enter(const at::Tensor& x) {
  return tp_size() > 1 ? TpEnterFn::apply(x, to_handle(mesh_.group(Axis::tp).get())) : x;
}

at::Tensor Parallel::tp_exit(const at::Tensor& x) {
  return tp_size() > 1 ? TpExitFn::apply(x, to_handle(mesh_.group(Axis::tp).get())) : x;
}

}  // namespace dion::train
