// src/train/optimizer_catalog.cpp — what dion-train can run: the optimizer library's registry
// (dion/optim/algorithm.h) as the config sees it (config_keys.h, OptimizerChoice).
#include "dion/optim/algorithm.h"
#include "config_keys.h"

namespace dion::train::config_detail {

const std::vector<OptimizerChoice>& optimizer_catalog() {
  static const std::vector<OptimizerChoice> catalog = [] {
    std::vector<OptimizerChoice> out;
    for (const Algorithm a : algorithms()) {
      const AlgorithmSpec& s = a.spec();
      out.push_back({s.name, s.matrix, s.aliases, s.train_reference_variants, s.optimizer_grad_sync});
    }
    return out;
  }();
  return catalog;
}

}  // namespace dion::train::config_detail
