// Whether a GPT of a given shape can be trained in this machine's memory (see
// dion/train/gpt.h, gpt_check_fits_memory).
#include <fmt/format.h>

#include <algorithm>
#include <unistd.h>

#include "dion/train/config.h"
#include "dion/train/gpt.h"

namespace dion::train {

void gpt_check_fits_memory(const GPTConfig& c, const at::Device& device, int shards) {
  if (!device.is_cpu()) return;
  // In double: model_dim 1e9 would overflow gpt_param_count's int64.
  const double d = double(c.n_embd);
  const double params = 2.0 * double(c.vocab_size) * d + double(c.n_layer) * 12.0 * d * d;
  const double needed = 16.0 * params / double(std::max(shards, 1));  // fp32 weight, grad, 2 states
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  if (memory <= 0 || needed <= memory) return;
  throw ConfigError(fmt::format(
      "keys 'model_dim' {}, 'n_layer' {}, 'vocab_size' {}: the model has {:.3g} parameters; training it needs at "
      "least {:.3g} GB on each of {} process(es) (fp32 weights, gradients and two optimizer states) but this "
      "machine has {:.3g} GB of memory; valid: a smaller model_dim, n_layer or vocab_size (or more processes)",
      c.n_embd, c.n_layer, c.vocab_size, params, needed / 1e9, std::max(shards, 1), memory / 1e9));
}

}  // namespace dion::train
