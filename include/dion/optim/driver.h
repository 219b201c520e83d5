// dion/optim/driver.h — what an algorithm driver gets: the library's own (src/optim/drivers/)
// and a plugin's (DION_ALGORITHM_PLUGIN, algorithm.h; tests/optim/sign_descent.cpp is one).
//
// A driver file defines its algorithms' specs (dion/optim/algorithm.h) and registers them in
// DION_BUILTIN_DRIVER(<file stem>) { ... } (src/optim/drivers/builtin.cpp calls the builtin
// driver files' registration functions, in the registry's listing order).
//
// The optimizer (optimizer.cpp) groups parameters, creates their state, buckets each matrix
// group's parameters into megabatches (same shape and dtype) and runs one task per megabatch
// (one per scalar group). A task calls the group's spec's update with:
//   Batch:   the parameters, their state (created before the task runs: drivers only read the
//            state map) and the group's index (for messages);
//   Options: the group's hyperparameters;
//   Env:     the communication patterns (dion/optim/collectives.h; one process without a Distribution)
//            and the orthogonalizer.
// A matrix driver asks plan_for() (dion/optim/plan.h) how its megabatch is laid out. One driver file per
// family, each reading like the reference's file of the same name (microsoft/dion); the math
// itself is in dion/math/; drivers hold no collectives of their own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

#include "dion/math/ortho.h"
#include "dion/math/rates.h"
#include "dion/optim/algorithm.h"
#include "dion/optim/options.h"
#include "dion/optim/collectives.h"
#include "dion/optim/plan.h"

namespace dion::driver {

struct Batch {
  std::vector<at::Tensor> params;  // X: a megabatch, each [*shape] (a scalar group: any shapes)
  std::vector<ParamState*> state;  // one per parameter
  size_t group = 0;                // the group's index
  // A matrix megabatch's layout and communication (plan.h), computed once by step() before any
  // task runs; a scalar group's is the default (whole, local).
  Plan plan = {};
};

struct Env {
  const Collectives* comm;
  const math::OrthoConfig* ortho;
  const math::OrthoFn* ortho_fn;
  // Per group: lr and weight decay on the device (Optimizer::set_device_scalars); null when the
  // math reads the host values.
  const std::vector<DeviceScalars>* device_scalars = nullptr;
};

// ---- shared by the specs

// The state tensors most algorithms keep: momentum like the parameter, in the parameter's dtype.
StateSpec momentum_like(const ParamView& p, std::optional<at::ScalarType> dtype = std::nullopt);
// The per-neuron (row) variance of the normalized algorithms: [.., m, 1] in the parameter's
// dtype; [.., m, 0] for an empty parameter (the reference's p[..., 0:1]). A shard holding none of
// the columns still keeps its rows' [.., m, 1] (state_layout.h).
StateSpec neuron_variance(const ParamView& p);

// ---- shared by the matrix drivers (operands.cpp)

// A megabatch's tensors as the math sees them — per-head views [H, hd, n] when num_heads is
// set — and the shape its learning rate is adjusted for (the global shape, or one head).
struct Operands {
  std::vector<at::Tensor> X, G, M, V;  // V: variance_neuron when asked for
  std::vector<int64_t> adjust_shape;
};
Operands operands(const Batch& batch, const Plan& plan, bool with_variance, const Collectives& comm);

inline float f32(double v) { return static_cast<float>(v); }

// The batch's lr and weight decay as the math reads them (dion/math/rates.h): the device form
// when the optimizer keeps them on the batch's device, else the group's host values;
// adjust_factor: adjusted_lr = lr * adjust_factor.
math::Rates rates_for(const Batch& batch, const Options& options, const Env& env, float adjust_factor = 1.0f);
// A 0-d float32 tensor: how the reference passes hyperparameters to elementwise kernels.
at::Tensor scalar32(float v);

}  // namespace dion::driver

// A builtin driver file's registration function (see the top of this file; a plugin registers
// with DION_ALGORITHM_PLUGIN instead).
#define DION_BUILTIN_DRIVER(stem) \
  namespace dion::detail {        \
  void register_driver_##stem();  \
  }                               \
  void ::dion::detail::register_driver_##stem()
