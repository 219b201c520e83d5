// The GPT parameter sets of dion-bench (see gpt_params.h).
#include "gpt_params.h"

#include <ATen/ATen.h>

#include <cmath>

namespace dion::bench {

ParamSet make_params(int64_t d, int64_t layers, int64_t vocab) {
  ParamSet p;
  auto param = [](std::vector<int64_t> shape) {
    at::Tensor v = at::randn(shape) * (shape.size() == 1 ? 1.0 : 1.0 / std::sqrt(double(shape.back())));
    v.mutable_grad() = at::randn(shape) * 1e-2;
    return v;
  };
  for (int64_t l = 0; l < layers; ++l) {
    for (int i = 0; i < 4; ++i) p.matrices.push_back(param({d, d}));
    p.matrices.push_back(param({4 * d, d}));
    p.matrices.push_back(param({d, 4 * d}));
    p.adamw.push_back(param({d}));
    p.adamw.push_back(param({d}));
  }
  p.adamw.push_back(param({vocab, d}));
  p.adamw.push_back(param({d}));
  p.lion.push_back(param({vocab, d}));
  return p;
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : ps) {
    at::Tensor c = p.detach().clone();
    c.mutable_grad() = p.grad().clone();
    out.push_back(c);
  }
  return out;
}

}  // namespace dion::bench
