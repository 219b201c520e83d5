// dion/train/optim_setup.h — the optimizer of a training run, built as the reference's
// train.py init_optimizer builds it.
//
// Groups (in this order, as the reference):
//   0  every parameter of the blocks (transformer.h.*: the attention and MLP matrices)
//      -> the `optimizer`'s algorithm with lr, mu, weight_decay, ortho_fraction, adjust_lr
//   1  the token embedding -> scalar_opt, lr, betas (scalar_beta1, scalar_beta2), default
//                             (0.9, 0.95): what train.py runs; weight decay 0
//   2  lm_head             -> scalar_opt, lr * lm_head_lr_scale(scalar_opt, model_dim),
//                             the same betas, weight decay 0
// Per optimizer (train.py): muon / normuon: nesterov, muon_beta2 0.95 (normuon); dion2:
// fraction = ortho_fraction, ef_decay = mu; nordion2 / dion3: fraction, mu, muon_beta2 0.95;
// dion: rank_fraction = ortho_fraction, oversample = rcqr_oversample, mixed_precision -> bf16
// momentum and Q; adamw: every group AdamW at lr, betas (0.9, 0.95) (scalar_opt ignored, as
// torch.optim.AdamW in train.py). lion (ours, not in train.py): every group Lion at lr, betas
// (0.9, 0.99). Orthogonalization: Newton-Schulz, or Polar Express with use_polar_express;
// use_gram_newton_schulz (Gram Newton-Schulz, dion/math/ortho.h) for muon, dion2 and nordion2 /
// dion3, the optimizers train.py passes it to (normuon and dion ignore it, as there).
// ortho_path -> OrthoConfig::path (exact | fast) of muon, normuon, dion2 and nordion2 / dion3
// (legacy dion orthonormalizes by QR and ignores it).
//
// What it is not: no learning-rate schedule (schedule.h), no distribution.
#pragma once

#include <memory>
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

}  // namespace dion::train
