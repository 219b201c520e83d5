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
#pragma once

#include "dion/errors.h"
#include "dion/math/ortho.h"
#include "dion/optim/optimizer.h"
#include "dion/optim/options.h"
