// AdamW and Lion: their specs and the scalar parameters' multi-tensor updates (the reference's
// dion/scalar_opts.py, adamw_update_foreach / lion_update_foreach). One task per group; the
// gradients are averaged over the replicas first when the Distribution asks the optimizer to.
#include <ATen/ATen.h>

#include "dion/math/scalar.h"
#include "dion/errors.h"
#include "dion/optim/driver.h"

namespace dion::driver {

namespace {

void adamw_update(const Batch& batch, const Options& o, const Env& env) {
  std::vector<at::Tensor> G = env.comm->synced_gradients(batch.params), M, V, steps;
  for (size_t i = 0; i < batch.params.size(); ++i) {
    const ParamState& s = *batch.state[i];
    G[i] = G[i].to(batch.params[i].scalar_type());
    M.push_back(s.momentum());
    V.push_back(s.variance());
    steps.push_back(s.step_dev());
  }
  const auto [b1, b2] = o.betas();
  const math::Rates r = rates_for(batch, o, env);  // lr on the device or not; weight decay stays on the host
  math::adamw_update(batch.params, G, M, V, steps,
                     {r.lr, f32(b1), f32(b2), r.weight_decay, f32(o.epsilon()), o.cautious_wd(), r.lr_dev});
}

void lion_update(const Batch& batch, const Options& o, const Env& env) {
  std::vector<at::Tensor> M;
  for (const ParamState* s : batch.state) M.push_back(s->momentum());
  const auto [b1, b2] = o.betas();
  const math::Rates r = rates_for(batch, o, env);
  math::lion_update(batch.params, env.comm->synced_gradients(batch.params), M,
                    {r.lr, f32(b1), f32(b2), r.weight_decay, o.cautious_wd(), r.lr_dev, r.weight_decay_dev});
}

AlgorithmSpec adamw_spec() {
  AlgorithmSpec s;
  s.name = "adamw";
  s.matrix = false;
  s.phase = 2;                    // after the matrix groups and lion, as the reference
  s.weight_decay_on_host = true;  // torch's fused AdamW takes it as a double
  s.state = [](const ParamView& p, const Options& o) {
    return std::vector<StateSpec>{
        momentum_like(p),
        {"variance", p.param.sizes().vec(), o.variance_dtype().value_or(p.param.scalar_type())},
        {"step_dev", {}, at::kFloat, StateLayout::SCALAR, /*from_step=*/true}};
  };
  s.check_options = [](const Options& o) -> std::optional<OptionError> {
    const auto [b1, b2] = o.betas();
    // Bias correction 1 - beta^t is 0 for beta1 = 1; beta2 >= 1 makes the variance negative.
    if (b1 == 1.0 || b2 >= 1.0)
      return OptionError{"betas", "each must be finite and >= 0; for adamw beta1 != 1 and beta2 < 1"};
    return std::nullopt;
  };
  s.check_param = [](const ParamView&, const Options& o, const std::string& what) {
    if (o.variance_dtype() && !at::isFloatingType(*o.variance_dtype()))
      throw ValueError(what + ": variance_dtype " + std::string(c10::toString(*o.variance_dtype())) +
                       " must be a floating-point dtype (e.g. the parameter's, or bfloat16)");
  };
  s.update = adamw_update;
  return s;
}

AlgorithmSpec lion_spec() {
  AlgorithmSpec s;
  s.name = "lion";
  s.matrix = false;
  s.phase = 1;
  s.state = [](const ParamView& p, const Options&) { return std::vector<StateSpec>{momentum_like(p)}; };
  s.update = lion_update;
  return s;
}

}  // namespace

}  // namespace dion::driver

DION_BUILTIN_DRIVER(scalar) {
  register_algorithm(driver::adamw_spec());
  register_algorithm(driver::lion_spec());
}
