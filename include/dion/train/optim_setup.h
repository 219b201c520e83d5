// dion/train/optim_setup.h — the optimizer of a training run, built as the reference's
// train.py init_optimizer builds it.
//
// Groups (in this order, as the reference):
//   0  every parameter of the blocks (transformer.h.*: the attention and MLP matrices)
//      -> the `optimizer`'s algorithm with lr, weight_decay and the keys its entry passes
//   1  the token embedding -> scalar_opt, lr (or embed_lr), betas (scalar_beta1, scalar_beta2),
//                             default (0.9, 0.95): what train.py runs; weight decay 0
//   2  lm_head             -> scalar_opt, lr * lm_head_lr_scale(scalar_opt, model_dim) (or
//                             lm_head_lr), the same betas, weight decay 0
// Per optimizer: its class as train.py constructs it, from dion-train's entry for the algorithm
// (dion/train/optimizer_entry.h, src/train/optimizer_entries.cpp: which config keys it takes, and
// how; whether use_gram_newton_schulz reaches it). A scalar algorithm as `optimizer` runs every group
// (scalar_opt ignored, as torch.optim.AdamW in train.py). Orthogonalization: Newton-Schulz, or
// Polar Express with use_polar_express; ortho_path -> OrthoConfig::path (exact | fast) of the
// orthogonalizing algorithms (a QR-based one ignores it).
//
// What it is not: no learning-rate schedule (schedule.h), no distribution.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "dion/optim/optimizer.h"
#include "dion/train/config.h"
#include "dion/train/gpt.h"

namespace dion::train {

struct TrainOptimizer {
  std::unique_ptr<dion::Optimizer> optimizer;
  std::vector<double> base_lrs;  // per group, before the schedule's factor
};

TrainOptimizer build_optimizer(const Config& config, GPT& model);

// The hyperparameters build_optimizer gives the groups, without a model: `matrix`, group 0's
// (the `optimizer`'s class defaults, as train.py constructs it); `scalar`, groups 1 and 2's
// (scalar_opt's, with lr = config lr; set only when `optimizer` is a matrix algorithm). What
// config_validate checks against the optimizer's rules (config_keys.h optimizer_error).
struct TrainGroupOptions {
  Options matrix;
  std::optional<Options> scalar;
};
TrainGroupOptions train_group_options(const Config& config, const AlgorithmSpec& spec);

}  // namespace dion::train
