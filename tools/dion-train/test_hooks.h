// tools/dion-train/test_hooks.h — the one place that reads dion-train's fault-injection
// variables, for the tests that run dion-train as a subprocess (tests/train/test_numerics.cpp,
// tests/train/parallel/test_parallel.cpp). Unset (every real run), no hook is installed.
//
//   DION_TEST_NONFINITE=RANK:STEP[,STEP...]   global rank RANK writes NaN into its first gradient
//       element at each 0-based training step STEP, before the gradient norm is taken
//       (TrainHooks::after_backward): a non-finite step, skipped on every rank;
//   DION_TEST_PERTURB_REPLICA=RANK:STEP        global rank RANK moves the first element of its
//       first parameter by one ulp after step STEP (TrainHooks::after_update): a replica drift.
//
// A value without "RANK:" installs nothing.
#pragma once

#include "dion/train/trainer.h"

namespace dion::train::tool {

TrainHooks test_hooks_from_env();

}  // namespace dion::train::tool
