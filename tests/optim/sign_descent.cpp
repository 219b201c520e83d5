// tests/optim/sign_descent.cpp — a whole algorithm in one file: sign descent with momentum,
// registered with the library's algorithm registry (dion/optim/algorithm.h). Nothing else in
// the library names it, and yet it runs through the C++ API (tests/optim/test_registry.cpp
// links this file), and, built as a plugin (the dion_sign_descent module: this file again),
// through the Python module, a dion-train config and `dion-bench step`
// (tests/optim/registry_proof.sh, tests/python/test_registry.py).
//
//   M = mu M + G;   X *= 1 - lr wd;   X -= lr sign(M)
#include <ATen/ATen.h>

#include "dion/optim/algorithm.h"
#include "dion/optim/options.h"
#include "dion/optim/driver.h"  // Batch, Env (and its collectives), the helpers of the specs

namespace {

using namespace dion;

void sign_descent_update(const driver::Batch& batch, const Options& o, const driver::Env& env) {
  const std::vector<at::Tensor> G = env.comm->synced_gradients(batch.params);  // averaged over replicas
  for (size_t i = 0; i < batch.params.size(); ++i) {
    const at::Tensor& X = batch.params[i];
    at::Tensor M = batch.state[i]->momentum();
    M.mul_(o.mu()).add_(G[i].to(M.scalar_type()));
    X.mul_(1.0 - o.lr() * o.weight_decay());
    X.add_(M.sign().to(X.scalar_type()), -o.lr());
  }
}

AlgorithmSpec sign_descent_spec() {
  AlgorithmSpec s;
  s.name = "sign_descent";
  s.state = [](const ParamView& p, const Options&) {
    return std::vector<StateSpec>{{"momentum", p.param.sizes().vec(), p.param.scalar_type()}};
  };
  s.check_options = [](const Options& o) -> std::optional<OptionError> {
    if (o.mu() >= 1.0) return OptionError{"mu", "must be < 1 for sign_descent"};
    return std::nullopt;
  };
  s.update = sign_descent_update;
  return s;
}

}  // namespace

DION_REGISTER_ALGORITHM(sign_descent_spec);
DION_ALGORITHM_PLUGIN()
