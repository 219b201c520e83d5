// tools/dion-bench/algorithms.cpp — dion-bench's table of the built-in algorithms (algorithms.h).
#include "algorithms.h"

#include <map>

namespace dion::bench {

const BenchEntry& bench_entry(const std::string& algorithm) {
  static const std::map<std::string, BenchEntry> table = {
      {"dion2", {"fraction"}},
      {"nordion2", {"fraction"}},
      {"dion", {"rank_fraction", [](Options& o) { o.rank_fraction(0.25); }}},
  };
  static const BenchEntry whole;
  const auto it = table.find(algorithm);
  return it == table.end() ? whole : it->second;
}

}  // namespace dion::bench
