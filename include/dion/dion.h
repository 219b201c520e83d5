// dion/dion.h — everything a training program needs from the dion library.
//
//   #include <dion/dion.h>
//   dion::Dion2 opt({{matrices}, {scalars, {.algorithm = "adamw", .lr = 3e-3}}},
//                   dion::Dion2::defaults().lr(0.02));
//   loss.backward(); opt.step(); opt.zero_grad();
//
// The reference's classes, one per matrix algorithm (below): Muon, NorMuon, Dion2, NorDion2
// (also Dion3), Dion (legacy). Each runs its own algorithm on matrix groups plus scalar groups
// ("adamw", "lion"); defaults() are the reference's defaults (the algorithm's spec's).
//
// Headers:
//   dion/optim/optimizer.h  Optimizer (any mix of algorithms), ParamGroup
//   dion/optim/algorithm.h  the algorithm registry (register your own: its API summary)
//   dion/optim/options.h    Options (per-group hyperparameters), Override, ParamState
//   dion/optim/qk_clip.h    QK-clip (MuonClip) of attention weights after the step, any layout
//   dion/math/*.h           the algorithms' math over lists of tensors, and the orthogonalizers
//   dion/errors.h           ValueError, TypeError, NotImplementedError
//   torch/nn/modules/linear.h  torch::nn::Linear; with the optimizer headers this brings the
//                           tensor API, autograd and the ATen ops (torch::mse_loss, torch::relu),
//                           so the README's example compiles with this header alone. Other
//                           modules: include <torch/nn.h> (not here: ~5 s more per file).
// Distributed: dion/optim/distributed.h (groups: dion/comm/, target dion::comm). Data tools:
// dion/data/*.h (dion::data).
#pragma once

#include <torch/nn/modules/linear.h>

#include "dion/errors.h"
#include "dion/math/ortho.h"
#include "dion/math/own_kernels.h"
#include "dion/optim/optimizer.h"
#include "dion/optim/options.h"
#include "dion/optim/qk_clip.h"

// A class of one registered matrix algorithm, named `Class` (C++) and `name` (the registry).
#define DION_OPTIMIZER_CLASS(Class, name)                                                                              \
  class Class : public ::dion::NamedOptimizer {                                                                        \
   public:                                                                                                             \
    static ::dion::Options defaults() { return defaults_of(name); }                                                    \
    explicit Class(const std::vector<::dion::ParamGroup>& groups, const ::dion::Options& defaults = Class::defaults(), \
                   ::dion::math::OrthoConfig ortho = {}, std::shared_ptr<::dion::Distribution> distribution = nullptr) \
        : NamedOptimizer(name, groups, defaults, std::move(ortho), std::move(distribution)) {}                         \
    Class(const std::vector<::dion::ParamGroup>& groups, const ::dion::Options& defaults,                              \
          std::shared_ptr<::dion::Distribution> distribution)                                                          \
        : NamedOptimizer(name, groups, defaults, {}, std::move(distribution)) {}                                       \
  }

namespace dion {
DION_OPTIMIZER_CLASS(Muon, "muon");
DION_OPTIMIZER_CLASS(NorMuon, "normuon");
DION_OPTIMIZER_CLASS(Dion2, "dion2");
DION_OPTIMIZER_CLASS(NorDion2, "nordion2");
using Dion3 = NorDion2;              // NorDion2 under its third-generation name: the same class
DION_OPTIMIZER_CLASS(Dion, "dion");  // legacy Dion: low-rank power iteration, 2-D parameters only
}  // namespace dion
