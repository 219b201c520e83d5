// tools/dion-train/test_hooks.cpp — DION_TEST_NONFINITE and DION_TEST_PERTURB_REPLICA as
// TrainHooks (test_hooks.h).
#include "test_hooks.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

namespace dion::train::tool {

namespace {

// "RANK:REST" -> (RANK, REST); false when the variable is unset, empty or has no ':'.
bool read_rank_spec(const char* name, int64_t* rank, std::string* rest) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  const std::string s = v;
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return false;
  *rank = std::stoll(s.substr(0, colon));
  *rest = s.substr(colon + 1);
  return true;
}

TrainHooks::ParamsHook nonfinite_hook() {
  int64_t rank = 0;
  std::string list;
  if (!read_rank_spec("DION_TEST_NONFINITE", &rank, &list)) return {};
  std::set<int64_t> steps;
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');)
    if (!item.empty()) steps.insert(std::stoll(item));
  return [rank, steps](int r, int64_t step, const std::vector<at::Tensor>& params) {
    if (r != rank || !steps.count(step)) return;
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params) {
      at::Tensor g = p.grad();
      if (!g.defined() || g.numel() == 0) continue;
      g.view({-1}).narrow(0, 0, 1).fill_(std::nan(""));
      return;
    }
  };
}

TrainHooks::ParamsHook perturb_replica_hook() {
  int64_t rank = 0;
  std::string at_step;
  if (!read_rank_spec("DION_TEST_PERTURB_REPLICA", &rank, &at_step)) return {};
  const int64_t when = std::stoll(at_step);
  return [rank, when](int r, int64_t step, const std::vector<at::Tensor>& params) {
    if (r != rank || step != when || params.empty()) return;
    at::NoGradGuard no_grad;
    const at::Tensor& p = params.front();
    if (p.numel() == 0) return;
    at::Tensor first = p.view({-1}).narrow(0, 0, 1);
    first.copy_(at::nextafter(first, first + 1));  // one ulp
  };
}

}  // namespace

TrainHooks test_hooks_from_env() {
  TrainHooks hooks;
  hooks.after_backward = nonfinite_hook();
  hooks.after_update = perturb_replica_hook();
  return hooks;
}

}  // namespace dion::train::tool
