// tools/dion-bench/algorithms.h — what dion-bench knows of an algorithm beyond the optimizer's
// contract (dion/optim/algorithm.h), keyed by its registered name: the hyperparameter that sets
// how much of each matrix it orthogonalizes and communicates (dist's ALGORITHM@F), the settings
// its `step` rows use beyond the defaults, whether its matrices go through the orthogonalizer
// (`step` times each --paths value for those, the exact path alone for the others), and whether
// it averages the gradients over the replicas itself (dist's DDP layout). An algorithm with no
// entry (a plugin's): whole matrices, the defaults, one path (exact), gradients synced outside.
#pragma once

#include <string>

#include "dion/optim/options.h"

namespace dion::bench {

struct BenchEntry {
  std::string size_option = {};              // "fraction", "rank_fraction"; "": the whole matrix
  void (*step_options)(Options&) = nullptr;  // `dion-bench step`: e.g. a low-rank algorithm's rank
  bool uses_orthogonalizer = false;          // its matrices go through the OrthoConfig's orthogonalizer
  bool optimizer_grad_sync = false;          // it averages the gradients over the replicas itself
};

const BenchEntry& bench_entry(const std::string& algorithm);

}  // namespace dion::bench
