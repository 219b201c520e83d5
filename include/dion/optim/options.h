// dion/optim/options.h — per-group hyperparameters and per-parameter state.
//
// Options: every hyperparameter a group of any algorithm reads, with chainable setters
//   (LibTorch style: `Options().lr(0.02).fraction(0.25)`). The named optimizers (Muon, Dion2,
//   ...) start from the reference class's defaults; `Override` changes some fields of one
//   group and leaves the rest at the optimizer's defaults.
// ParamState: momentum, variance (adamw), variance_neuron (normuon, nordion2), Q (dion),
//   step_dev (adamw's per-parameter step): the reference's state names.
//
// Algorithms (Options::algorithm): "muon", "normuon", "dion2", "nordion2" (Dion3 uses the
// same string), "dion" (legacy), "adamw", "lion".
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dion/math/lr.h"

namespace dion {

using math::AdjustLR;

// The algorithm names a group may use.
const std::vector<std::string>& known_algorithms();
bool is_matrix_algorithm(const std::string& algorithm);  // muon..dion: need ndim >= 2

class Options : public torch::optim::OptimizerCloneableOptions<Options> {
 public:
  explicit Options(double lr = 0.01) : lr_(lr) {}

  TORCH_ARG(std::string, algorithm) = "muon";
  TORCH_ARG(double, lr);
  TORCH_ARG(double, weight_decay) = 0.01;
  TORCH_ARG(double, mu) = 0.95;                          // momentum (EF decay for nordion2)
  TORCH_ARG(double, muon_beta2) = 0.95;                  // normuon / nordion2 variance EMA
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.95);  // adamw / lion (beta1, beta2)
  TORCH_ARG(double, epsilon) = 1e-8;
  TORCH_ARG(double, fraction) = 0.25;                    // dion2 / nordion2: selected fraction
  TORCH_ARG(double, ef_decay) = 0.95;                    // dion2: error-feedback decay
  TORCH_ARG(AdjustLR, adjust_lr) = AdjustLR::SPECTRAL_NORM;
  TORCH_ARG(bool, cautious_wd) = false;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(bool, flatten) = false;                      // 3-D+ params as [dim0, prod(rest)]
  TORCH_ARG(int64_t, num_heads) = 0;                     // 0 or 1: off; >1: per-head ortho
  TORCH_ARG(std::vector<int64_t>, split_sizes) = {};     // row blocks of a fused weight
  TORCH_ARG(std::string, selection_scope) = "local";     // dion2/nordion2 when row-sharded
  // dion2 on a sharded matrix: select along the dim one process would ("shorter", the default:
  // the result equals one process's for every shape) or along the sharded dim, as the reference
  // does ("shard"). docs/distributed.md lists which layouts equal one process.
  TORCH_ARG(std::string, selection_dim) = "shorter";
  TORCH_ARG(double, rank_fraction) = 1.0;                // dion: r = rank_fraction * min(m, n)
  TORCH_ARG(int64_t, rank_multiple_of) = 1;              // dion: round r up to a multiple
  TORCH_ARG(double, oversample) = 1.25;                  // dion: randomized QR sketch size
  TORCH_ARG(std::optional<at::ScalarType>, momentum_dtype) = std::nullopt;  // dion mixed precision
  TORCH_ARG(std::optional<at::ScalarType>, Q_dtype) = std::nullopt;
  TORCH_ARG(std::optional<at::ScalarType>, variance_dtype) = std::nullopt;
  TORCH_ARG(int64_t, step) = 0;                          // steps taken by this group

 public:
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
};

// Fields to change for one group; unset fields keep the optimizer's defaults.
// C++20 designated initializers read well here:  Override{.algorithm = "adamw", .lr = 3e-4}
// (fields in declaration order; every field defaults to unset, so -Wextra stays quiet).
struct Override {
  std::optional<std::string> algorithm = std::nullopt;
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  std::optional<double> mu = std::nullopt;
  std::optional<double> muon_beta2 = std::nullopt;
  std::optional<std::tuple<double, double>> betas = std::nullopt;
  std::optional<double> epsilon = std::nullopt;
  std::optional<double> fraction = std::nullopt;
  std::optional<double> ef_decay = std::nullopt;
  std::optional<AdjustLR> adjust_lr = std::nullopt;
  std::optional<bool> cautious_wd = std::nullopt;
  std::optional<bool> nesterov = std::nullopt;
  std::optional<bool> flatten = std::nullopt;
  std::optional<int64_t> num_heads = std::nullopt;
  std::optional<std::vector<int64_t>> split_sizes = std::nullopt;
  std::optional<std::string> selection_scope = std::nullopt;
  std::optional<std::string> selection_dim = std::nullopt;
  std::optional<double> rank_fraction = std::nullopt;
  std::optional<int64_t> rank_multiple_of = std::nullopt;

  Options apply(Options base) const;
};

class ParamState : public torch::optim::OptimizerCloneableParamState<ParamState> {
 public:
  TORCH_ARG(at::Tensor, momentum);
  TORCH_ARG(at::Tensor, variance);         // adamw second moment
  TORCH_ARG(at::Tensor, variance_neuron);  // normuon / nordion2: [.., m, 1]
  TORCH_ARG(at::Tensor, Q);                // dion: [n, r] or [m, r] when transposed
  TORCH_ARG(at::Tensor, step_dev);         // adamw: 0-d fp32 step counter

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

}  // namespace dion
