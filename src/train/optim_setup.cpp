// src/train/optim_setup.cpp — param groups and optimizer per `optimizer` key (optim_setup.h).
#include "dion/train/optim_setup.h"

#include "dion/train/optimizer_entry.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace dion::train {

namespace {
// train.py writes betas=(0.95, 0.98) into the embedding and lm_head groups, but its Dion-family
// optimizers read the group keys beta1 / beta2, filled from their constructor default (0.9,
// 0.95): keys scalar_beta1 / scalar_beta2, default that effective pair (docs/train.md "Parameter
// groups").
Override scalar_group(const Config& c, double lr) {
  return {.algorithm = c.scalar_opt, .lr = lr, .weight_decay = 0.0, .betas = Betas{c.scalar_beta1, c.scalar_beta2}};
}

// Group 0's hyperparameters: the class's defaults, then the keys train.py's constructor call passes.
Options matrix_defaults(const Config& c, const AlgorithmSpec& spec) {
  Options defaults = NamedOptimizer::defaults_of(spec.name).lr(c.lr).weight_decay(c.weight_decay);
  if (const TrainEntry& e = train_entry(spec.name); e.options) e.options(defaults, c);
  return defaults;
}
}  // namespace

TrainGroupOptions train_group_options(const Config& c, const AlgorithmSpec& spec) {
  TrainGroupOptions out{matrix_defaults(c, spec), std::nullopt};
  if (spec.matrix) out.scalar = scalar_group(c, c.lr).apply(out.matrix);
  return out;
}

TrainOptimizer build_optimizer(const Config& c, GPT& model) {
  const Algorithm algo = find_algorithm(c.optimizer, /*aliases=*/true);
  if (!algo)
    throw ConfigError("key 'optimizer': value '" + c.optimizer + "' is invalid");  // config_validate catches it first
  const AlgorithmSpec& spec = algo.spec();
  math::OrthoConfig ortho;
  ortho.method = c.use_polar_express ? math::OrthoMethod::POLAR_EXPRESS : math::OrthoMethod::NEWTON_SCHULZ;
  ortho.path = math::ortho_path_from_string(c.ortho_path);  // config_validate has checked the value
  ortho.cuda_kernels = c.cuda_kernels;                      // the own CUDA kernels: opt-in (dion/math/own_kernels.h)
  // train.py passes use_gram_newton_schulz to some classes only; the others ignore it there, and so here.
  ortho.use_gram_newton_schulz = c.use_gram_newton_schulz && train_entry(spec.name).gram_newton_schulz;
  const Options defaults = matrix_defaults(c, spec);

  std::vector<at::Tensor> matrices = model->block_params();
  // MoE routers: with the embedding's optimizer (scalar_opt, at lr) unless router_opt is matrix.
  std::vector<at::Tensor> routers;
  if (c.router_opt == "scalar" && spec.matrix) {
    routers = model->router_params();
    std::erase_if(matrices, [&](const at::Tensor& p) {
      return std::any_of(routers.begin(), routers.end(), [&](const at::Tensor& r) { return r.is_same(p); });
    });
  }
  std::vector<at::Tensor> embedding = {model->embedding_weight()};
  std::vector<at::Tensor> lm_head = {model->lm_head_weight()};

  TrainOptimizer out;
  if (!spec.matrix) {
    // A scalar optimizer (train.py's "adamw": torch.optim.AdamW) over the same three groups,
    // every lr = hp.lr; the embedding and lm_head groups keep weight decay 0.
    // embed_lr / lm_head_lr, where set, replace lr in their group.
    const double embed_lr = c.embed_lr > 0 ? c.embed_lr : c.lr, head_lr = c.lm_head_lr > 0 ? c.lm_head_lr : c.lr;
    std::vector<ParamGroup> groups = {{matrices},
                                      {embedding, {.lr = embed_lr, .weight_decay = 0.0}},
                                      {lm_head, {.lr = head_lr, .weight_decay = 0.0}}};
    out.optimizer = std::make_unique<Optimizer>(groups, defaults, ortho);
    out.base_lrs = {c.lr, embed_lr, head_lr};
    return out;
  }

  // The reference's rule (embedding at lr, lm_head at lr x lm_head_lr_scale) unless embed_lr /
  // lm_head_lr set their group's rate apart (the convergence study tunes them apart).
  const double embed_lr = c.embed_lr > 0 ? c.embed_lr : c.lr;
  const double lm_head_lr = c.lm_head_lr > 0 ? c.lm_head_lr : c.lr * lm_head_lr_scale(c.scalar_opt, c.model_dim);
  std::vector<ParamGroup> groups = {
      {matrices}, {embedding, scalar_group(c, embed_lr)}, {lm_head, scalar_group(c, lm_head_lr)}};
  out.base_lrs = {c.lr, embed_lr, lm_head_lr};
  if (!routers.empty()) {
    const double router_lr = c.router_lr > 0 ? c.router_lr : c.lr;
    groups.push_back({routers, scalar_group(c, router_lr)});
    out.base_lrs.push_back(router_lr);
  }
  out.optimizer = std::make_unique<NamedOptimizer>(spec.name, groups, defaults, ortho, nullptr);
  return out;
}

}  // namespace dion::train
