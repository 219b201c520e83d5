// dion/dion.h — everything a training program needs from the dion library.
//
//   #include <dion/dion.h>
//   dion::Dion2 opt({{matrices}, {scalars, {.algorithm = "adamw", .lr = 3e-3}}},
//                   dion::Dion2::defaults().lr(0.02));
//   loss.backward(); opt.step(); opt.zero_grad();
//
// Headers:
//   dion/optim/optimizer.h  the optimizer classes (Optimizer, Muon, NorMuon, Dion2, NorDion2 =
//                           Dion3, Dion), ParamGroup, lm_head_lr_scale
//   dion/optim/options.h    Options (per-group hyperparameters), Override, ParamState
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
#include "dion/optim/optimizer.h"
#include "dion/optim/options.h"
