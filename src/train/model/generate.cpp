// src/train/model/generate.cpp — sampling loop (generate.h).
#include "dion/train/generate.h"

#include <ATen/ATen.h>

#include <functional>

namespace dion::train {

void generate(GPT& model, std::vector<int64_t>& ids, const GenerateOptions& o, at::Generator& gen,
              const std::function<void(int64_t)>& on_token) {
  at::NoGradGuard no_grad;
  model->eval();
  const int64_t ctx = model->config().sequence_len;
  const at::Device device = model->lm_head_weight().device();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - ctx);
    at::Tensor idx =
        at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).view({1, -1}).to(device);
    at::Tensor logits = model->logits(idx).select(1, -1).to(at::kCPU);  // [1, V]
    int64_t next;
    if (o.temperature <= 0) {
      next = logits.argmax(-1).item<int64_t>();
    } else {
      logits = logits / o.temperature;
      if (o.top_k > 0) {
        at::Tensor kth = std::get<0>(at::topk(logits, std::min<int64_t>(o.top_k, logits.size(-1)))).select(1, -1);
        logits = logits.masked_fill(logits < kth.unsqueeze(1), -std::numeric_limits<double>::infinity());
      }
      at::Tensor probs = at::softmax(logits, -1);
      next = at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    }
    ids.push_back(next);
    if (on_token) on_token(next);
  }
}

}  // namespace dion::train
