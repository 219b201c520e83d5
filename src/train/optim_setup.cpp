// src/train/optim_setup.cpp — param groups and optimizer per `optimizer` key (optim_setup.h).
#include "dion/train/optim_setup.h"

#include <ATen/ATen.h>

namespace dion::train {

TrainOptimizer build_optimizer(const Config& c, GPT& model) {
  const std::string& name = c.optimizer;
  math::OrthoConfig ortho;
  ortho.method = c.use_polar_express ? math::OrthoMethod::POLAR_EXPRESS : math::OrthoMethod::NEWTON_SCHULZ;
  ortho.path = math::ortho_path_from_string(c.ortho_path);  // config_validate has checked the value
  // train.py passes use_gram_newton_schulz to Muon, Dion2 and NorDion2 (= Dion3) only; NorMuon and
  // Dion ignore it there, and so here.
  ortho.use_gram_newton_schulz =
      c.use_gram_newton_schulz && (name == "muon" || name == "dion2" || name == "nordion2" || name == "dion3");

  std::vector<at::Tensor> matrices = model->block_params();
  std::vector<at::Tensor> embedding = {model->embedding_weight()};
  std::vector<at::Tensor> lm_head = {model->lm_head_weight()};

  TrainOptimizer out;
  if (name == "adamw" || name == "lion") {
    // train.py's "adamw": torch.optim.AdamW over the same three groups, every lr = hp.lr, betas
    // (0.9, 0.95); the embedding and lm_head groups keep weight decay 0.
    const auto betas = name == "adamw" ? std::make_tuple(0.9, 0.95) : std::make_tuple(0.9, 0.99);
    Options defaults = Options(c.lr).algorithm(name).betas(betas).weight_decay(c.weight_decay);
    std::vector<ParamGroup> groups = {{matrices}, {embedding, {.weight_decay = 0.0}}, {lm_head, {.weight_decay = 0.0}}};
    out.optimizer = std::make_unique<Optimizer>(groups, defaults, ortho);
    out.base_lrs = {c.lr, c.lr, c.lr};
    return out;
  }

  const double lm_head_lr = c.lr * lm_head_lr_scale(c.scalar_opt, c.model_dim);
  // train.py writes betas=(0.95, 0.98) into these groups, but its Dion-family optimizers read
  // the group keys beta1 / beta2, filled from their constructor default (0.9, 0.95): keys
  // scalar_beta1 / scalar_beta2, default that effective pair (docs/train.md "Parameter groups").
  const auto scalar_betas = std::make_tuple(c.scalar_beta1, c.scalar_beta2);
  std::vector<ParamGroup> groups = {
      {matrices},
      {embedding, {.algorithm = c.scalar_opt, .lr = c.lr, .weight_decay = 0.0, .betas = scalar_betas}},
      {lm_head, {.algorithm = c.scalar_opt, .lr = lm_head_lr, .weight_decay = 0.0, .betas = scalar_betas}},
  };
  out.base_lrs = {c.lr, c.lr, lm_head_lr};

  if (name == "muon") {
    Options d = Muon::defaults().lr(c.lr).mu(c.mu).weight_decay(c.weight_decay).nesterov(true).adjust_lr(c.adjust_lr);
    out.optimizer = std::make_unique<Muon>(groups, d, ortho);
  } else if (name == "normuon") {
    Options d = NorMuon::defaults().lr(c.lr).mu(c.mu).muon_beta2(0.95).weight_decay(c.weight_decay).nesterov(true)
                    .adjust_lr(c.adjust_lr);
    out.optimizer = std::make_unique<NorMuon>(groups, d, ortho);
  } else if (name == "dion2") {
    Options d = Dion2::defaults().lr(c.lr).fraction(c.ortho_fraction).ef_decay(c.mu).weight_decay(c.weight_decay)
                    .adjust_lr(c.adjust_lr);
    out.optimizer = std::make_unique<Dion2>(groups, d, ortho);
  } else if (name == "nordion2" || name == "dion3") {
    Options d = NorDion2::defaults().lr(c.lr).fraction(c.ortho_fraction).mu(c.mu).muon_beta2(0.95)
                    .weight_decay(c.weight_decay).adjust_lr(c.adjust_lr);
    out.optimizer = std::make_unique<NorDion2>(groups, d, ortho);
  } else if (name == "dion") {
    Options d = Dion::defaults().lr(c.lr).mu(c.mu).weight_decay(c.weight_decay).rank_fraction(c.ortho_fraction)
                    .oversample(c.rcqr_oversample);
    // train.py's DionMixedPrecisionConfig(momentum, variance, Q: bf16); the variance is the AdamW
    // scalar groups' (the scalar groups' momentum stays the parameter's: docs/train.md).
    if (c.mixed_precision) d.momentum_dtype(at::kBFloat16).Q_dtype(at::kBFloat16).variance_dtype(at::kBFloat16);
    out.optimizer = std::make_unique<Dion>(groups, d);
  } else {
    throw ConfigError("key 'optimizer': value '" + name + "' is invalid");  // config_validate catches it first
  }
  return out;
}

}  // namespace dion::train
