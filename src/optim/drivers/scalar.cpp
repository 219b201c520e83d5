// AdamW and Lion: the scalar parameters' multi-tensor updates (the reference's
// dion/scalar_opts.py, adamw_update_foreach / lion_update_foreach). One task per group; the
// gradients are averaged over the replicas first when the Distribution asks the optimizer to.
#include <ATen/ATen.h>

#include "dion/math/scalar.h"
#include "driver.h"

namespace dion::driver {

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

}  // namespace dion::driver
