// tools/dion-bench/algorithms.h — what dion-bench knows of an algorithm beyond the optimizer's
// contract (dion/optim/algorithm.h), keyed by its registered name: the hyperparameter that sets
// how much of each matrix it orthogonalizes and communicates (dist's ALGORITHM@F), and the
// settings its `step` rows use beyond the defaults. An algorithm with no entry (a plugin's):
// whole matrices, the defaults.
#pragma once

#include <string>

#include "dion/optim/options.h"

namespace dion::bench {

struct BenchEntry {
  std::string size_option;                   // "fraction", "rank_fraction"; "": the whole matrix
  void (*step_options)(Options&) = nullptr;  // `dion-bench step`: e.g. a low-rank algorithm's rank
};

const BenchEntry& bench_entry(const std::string& algorithm);

}  // namespace dion::bench
