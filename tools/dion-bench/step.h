// tools/dion-bench/step.h — `dion-bench step`: one optimizer step per algorithm and
// orthogonalizer path on GPT-shaped parameter sets, interleaved, with bytes allocated per step
// and the difference of each path to the first.
#pragma once

#include <string>

#include "args.h"

namespace dion::bench {

// "a,b,c": the registered matrix algorithms (dion/optim/algorithm.h), plugins included.
std::string matrix_algorithms();

struct StepArgs {
  std::string sets = "768x2,256x4";
  std::string algos = matrix_algorithms();  // every registered matrix algorithm
  std::string paths = "exact,fast,gram";
  int reps = 3;
  int64_t vocab = 8192;
  bool phases = false;
};

void run_step(const Common& common, const StepArgs& args);

}  // namespace dion::bench
