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

std::vector<PythonKeyword> python_keywords(const std::vector<std::string>& names) {
  // The reference's keywords and defaults (microsoft/dion: the classes of its orthonormal family).
  static const std::vector<PythonKeyword> known = {
      {"distributed_mesh", "None", "mesh"},
      {"lr", "0.01"},
      {"fraction", "0.25", "float"},
      {"ef_decay", "0.95"},
      {"mu", "0.95"},
      {"muon_beta2", "0.95"},
      {"betas", "(0.9, 0.95)"},
      {"weight_decay", "0.01"},
      {"cautious_wd", "False"},
      {"epsilon", "1e-08"},
      {"nesterov", "False"},
      {"adjust_lr", "'spectral_norm'"},
      {"flatten", "False"},
      {"use_gram_newton_schulz", "False", "extra"},
      {"use_triton", "False", "extra"},
      {"use_polar_express", "True", "extra"},
      {"newton_schulz_func", "None", "extra"},
      {"verbose", "False", "attribute"},
      {"triton_post_ortho", "False", "ignored"},
      {"selection_scope", "'local'"},
      {"selection_dim", "'shorter'"},
  };
  std::vector<PythonKeyword> out;
  for (const std::string& n : names) {
    auto it = std::find_if(known.begin(), known.end(), [&](const PythonKeyword& k) { return k.name == n; });
    TORCH_CHECK(it != known.end(), "python_keywords: no keyword '", n, "'");
    out.push_back(*it);
  }
  return out;
}

}  // namespace dion::driver
