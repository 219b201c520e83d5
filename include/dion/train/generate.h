// dion/train/generate.h — text generation with a GPT, as the reference's GPT.generate: feed the
// last sequence_len tokens, take the last position's logits / temperature, keep the top_k,
// sample from the softmax; temperature 0 picks the most likely token.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "dion/train/gpt.h"

namespace dion::train {

struct GenerateOptions {
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 50;        // 0: no filter
};

// Appends up to max_tokens ids to `ids` (non-empty). `on_token` (optional) sees each new id.
void generate(GPT& model, std::vector<int64_t>& ids, const GenerateOptions& options, at::Generator& gen,
              const std::function<void(int64_t)>& on_token = nullptr);

}  // namespace dion::train
