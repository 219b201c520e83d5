// dion/optim/options.h — per-group hyperparameters and per-parameter state.
//
// Options: the group's algorithm and every hyperparameter a group of any algorithm reads (one
//   table, dion/optim/hyperparameters.h), with chainable setters (LibTorch style:
//   `Options().lr(0.02).fraction(0.25)`). The named optimizers (Muon, Dion2,
//   ...) start from the reference class's defaults; `Override` changes some fields of one
//   group and leaves the rest at the optimizer's defaults.
// ParamState: the state tensors of one parameter by key (the reference's names: momentum,
//   variance, variance_neuron, Q, step_dev); which keys an algorithm keeps is its spec's.
//
// Algorithms (Options::algorithm): the registered ones (dion/optim/algorithm.h; listed by
// dion::algorithm_names()).
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dion/math/lr.h"
#include "dion/optim/algorithm.h"
#include "dion/optim/hyperparameters.h"

namespace dion {

using math::AdjustLR;

// The algorithm of a group (dion/optim/algorithm.h): names are the API edge
// (Options::algorithm(name), the trainer's config, Python); inside the optimizer the handle is
// compared and its spec asked.

class Options : public torch::optim::OptimizerCloneableOptions<Options> {
 public:
  // The algorithm: the first registered one (algorithms().front()) until set.
  explicit Options(double lr = 0.01);

  // The hyperparameters (dion/optim/hyperparameters.h): chainable setter and getter each.
#define DION_OPTIONS_FIELD(T, name, default_value, rule, doc) TORCH_ARG(T, name) = default_value;
  DION_HYPERPARAMETERS(DION_OPTIONS_FIELD)
#undef DION_OPTIONS_FIELD
  TORCH_ARG(int64_t, step) = 0;  // steps taken by this group

 public:
  using betas_t = Betas;

  // The group's algorithm. The string setter accepts the names of algorithms() (algorithm.h); an
  // unknown name is kept so that validate() can name it in its error.
  Options& algorithm(Algorithm a) {
    algorithm_ = a;
    unknown_algorithm_.clear();
    return *this;
  }
  Options& algorithm(const std::string& name);
  Options& algorithm(const char* name) { return algorithm(std::string(name)); }
  std::string algorithm() const;                 // its name
  Algorithm algo() const { return algorithm_; }  // the handle (valid once validate() passed)
  const AlgorithmSpec& spec() const { return algorithm_.spec(); }

  Options& adjust_lr(const std::string& name) {  // "spectral_norm" | "rms_norm" | "none"
    adjust_lr_ = math::adjust_lr_from_string(name);
    return *this;
  }
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const Options& a, const Options& b);

  // Check every field for `group` (its index, for the message) and throw std::invalid_argument
  // naming the group, the option and the value when one is invalid.
  void validate(size_t group) const;
  std::string value_string(const std::string& option) const;  // a hyperparameter's value, printed

 private:
  Algorithm algorithm_;
  std::string unknown_algorithm_;  // an unknown name given to algorithm(name), for validate()
};

// Fields to change for one group; unset fields keep the optimizer's defaults.
// C++20 designated initializers read well here:  Override{.algorithm = "adamw", .lr = 3e-4}
// (fields in declaration order: algorithm, then the hyperparameters in table order; every field
// defaults to unset, so -Wextra stays quiet).
struct Override {
  std::optional<std::string> algorithm = std::nullopt;
#define DION_OVERRIDE_FIELD(T, name, default_value, rule, doc) std::optional<T> name = std::nullopt;
  DION_HYPERPARAMETERS(DION_OVERRIDE_FIELD)
#undef DION_OVERRIDE_FIELD

  Options apply(Options base) const;
};

// A group's lr and weight decay as 0-d float32 tensors on its parameters' device, filled from the
// group's Options before each step when the optimizer reads them there
// (Optimizer::set_device_scalars; dion/math/rates.h). Undefined for a group without parameters.
struct DeviceScalars {
  at::Tensor lr, weight_decay;
};

// A parameter's state tensors by key, in creation order (AlgorithmSpec::state). The named
// accessors are the keys the builtin algorithms use; get / set / tensors serve any key.
class ParamState : public torch::optim::OptimizerCloneableParamState<ParamState> {
 public:
  // The tensor under `key` (undefined when absent); set adds or replaces it.
  const at::Tensor& get(const std::string& key) const;
  ParamState& set(const std::string& key, at::Tensor value);
  const std::vector<std::pair<std::string, at::Tensor>>& tensors() const { return tensors_; }
  std::vector<std::pair<std::string, at::Tensor>>& tensors() { return tensors_; }

  const at::Tensor& momentum() const { return get("momentum"); }
  const at::Tensor& variance() const { return get("variance"); }                // second moment
  const at::Tensor& variance_neuron() const { return get("variance_neuron"); }  // [.., m, 1]
  const at::Tensor& Q() const { return get("Q"); }                              // [n, r] (or [m, r])
  const at::Tensor& step_dev() const { return get("step_dev"); }                // 0-d fp32 step counter
  ParamState& momentum(at::Tensor t) { return set("momentum", std::move(t)); }
  ParamState& variance(at::Tensor t) { return set("variance", std::move(t)); }
  ParamState& variance_neuron(at::Tensor t) { return set("variance_neuron", std::move(t)); }
  ParamState& Q(at::Tensor t) { return set("Q", std::move(t)); }
  ParamState& step_dev(at::Tensor t) { return set("step_dev", std::move(t)); }

  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;

 private:
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

}  // namespace dion
