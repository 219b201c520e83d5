// The config fuzzer's optimizer catalog (it links the config files without LibTorch, and so
// without the optimizer registry that src/train/optimizer_catalog.cpp reads): a fixed list of
// the shape the registry gives, enough to reach every branch of the config checks.
#include "../../src/train/config_keys.h"

namespace dion::train::config_detail {

const std::vector<OptimizerChoice>& optimizer_catalog() {
  static const std::vector<OptimizerChoice> catalog = {
      {"muon", true, {}, {"muon_reference"}, false},
      {"dion",
       true,
       {},
       {"dion_reference", "dion_simple"},
       true,
       "legacy Dion ('dion') cannot step the MoE expert stacks"},
      {"nordion2", true, {"dion3"}, {}, false},
      {"adamw", false, {}, {}, false},
      {"lion", false, {}, {}, false},
  };
  return catalog;
}

}  // namespace dion::train::config_detail

namespace dion::train::config_detail {

// The optimizer library's rules need LibTorch; the fuzzer exercises the parser and the
// trainer's own checks, and every value passes here.
std::string optimizer_error(const Config&) { return ""; }

}  // namespace dion::train::config_detail
