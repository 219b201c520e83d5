// tools/dion-bench/algorithms.cpp — dion-bench's table of the built-in algorithms (algorithms.h).
#include "algorithms.h"

#include <map>

namespace dion::bench {

const BenchEntry& bench_entry(const std::string& algorithm) {
  static const std::map<std::string, BenchEntry> table = {
      {"muon", {.uses_orthogonalizer = true}},
      {"normuon", {.uses_orthogonalizer = true}},
      {"dion2", {.size_option = "fraction", .uses_orthogonalizer = true}},
      {"nordion2", {.size_option = "fraction", .uses_orthogonalizer = true}},
      // randomized QR, no orthogonalizer; with replicas: compressed P and R, synced by itself
      {"dion",
       {.size_option = "rank_fraction",
        .step_options = [](Options& o) { o.rank_fraction(0.25); },
        .optimizer_grad_sync = true}},
  };
  static const BenchEntry whole;
  const auto it = table.find(algorithm);
  return it == table.end() ? whole : it->second;
}

}  // namespace dion::bench
