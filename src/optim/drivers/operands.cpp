// What the drivers share: a megabatch's operands as the math sees them, the common state
// tensors, and the reference's Python keywords (see driver.h).
#include <ATen/ATen.h>

#include <algorithm>

#include "dion/optim/driver.h"

namespace dion::driver {

namespace {
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
}  // namespace

at::Tensor scalar32(float v) { return at::scalar_tensor(v, at::kFloat); }

math::Rates rates_for(const Batch& batch, const Options& o, const Env& env, float adjust_factor) {
  const float lr = f32(o.lr()), wd = f32(o.weight_decay());
  if (env.device_scalars && batch.group < env.device_scalars->size()) {
    const DeviceScalars& d = (*env.device_scalars)[batch.group];
    if (d.lr.defined() && !batch.params.empty() && d.lr.device() == batch.params[0].device())
      return math::Rates::device(d.lr, d.weight_decay, lr, wd).adjusted(adjust_factor);
  }
  return math::Rates::host(lr, wd).adjusted(adjust_factor);
}

Operands operands(const Batch& batch, const Plan& plan, bool with_variance, const Collectives& comm) {
  Operands ops;
  ops.X = batch.params;
  ops.G = comm.synced_gradients(batch.params);
  for (ParamState* s : batch.state) {
    ops.M.push_back(s->momentum());
    if (with_variance) ops.V.push_back(s->variance_neuron());
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

StateSpec momentum_like(const ParamView& p, std::optional<at::ScalarType> dtype) {
  return {"momentum", p.param.sizes().vec(), dtype.value_or(p.param.scalar_type())};
}

StateSpec neuron_variance(const ParamView& p) {
  std::vector<int64_t> shape = p.param.sizes().vec();
  shape.back() = std::min<int64_t>(1, p.global_shape.back());
  return {"variance_neuron", std::move(shape), p.param.scalar_type(), StateLayout::NEURON};
}

}  // namespace dion::driver
