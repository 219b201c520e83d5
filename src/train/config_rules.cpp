// src/train/config_rules.cpp — what values dion-train's keys accept: each key's own check (its
// row's Check in config_keys.cpp) and the relations between keys (config_validate), with
// messages that name the key, its value and what is valid. Also the values derived from keys.
#include "config_keys.h"
#include "dion/train/mesh_shape.h"
#include "dion/train/train.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace dion::train {

namespace {

using namespace config_detail;

// The per-key check: "" when valid, else what is valid.
std::string key_valid(const Config& c, const Key& k) {
  auto num = [&] { return number_of(c, k.field); };
  switch (k.check) {
    case Check::ANY:
    case Check::OPTIMIZER:  // optimizer_error(), after every key's own check
      return "";
    case Check::POSITIVE:
      return num() > 0 ? "" : "a value > 0";
    case Check::NON_NEGATIVE:
      return num() >= 0 ? "" : "a value >= 0";
    case Check::RATIO:
      return num() >= 0 && num() <= 1 ? "" : "a value in [0, 1]";
    case Check::FRACTION:
      return num() > 0 && num() <= 1 ? "" : "a value in (0, 1]";
    case Check::CHOICE: {
      const std::string v = value_text(c, k.field);
      const std::vector<std::string> choices = choices_of(k);
      for (const std::string& choice : choices)
        if (v == choice) return "";
      return "one of: " + join_choices(choices) + did_you_mean(v, choices);
    }
  }
  return "";
}

// The error of key `k`'s value in `c`, "" when it is valid. A value the reference's train.py
// accepts but dion-train does not implement says so and names the nearest supported choice.
std::string key_error(const Config& c, const Key& k) {
  const std::string v = value_text(c, k.field);
  for (const auto& [ref, nearest] : reference_only_of(k))
    if (v == ref)
      return fmt::format(
          "key '{}': value '{}' is not implemented in dion-train (the reference train.py accepts it); "
          "the nearest supported choice is '{}' (supported: {})",
          k.name, v, nearest, join_choices(choices_of(k)));
  const std::string valid = key_valid(c, k);
  return valid.empty() ? "" : fmt::format("key '{}': value '{}' is invalid; valid: {}", k.name, v, valid);
}

}  // namespace

int64_t Config::val_steps() const {
  const int64_t steps = val_tokens / (device_batch_size * sequence_length * data_parallel_size());
  return debug ? std::min<int64_t>(steps, 2) : steps;
}

std::filesystem::path Config::resolved_run_dir() const {
  if (!run_dir.empty()) return run_dir;
  const std::string stem = config_file.empty() ? "default" : std::filesystem::path(config_file).stem().string();
  return std::filesystem::path("runs") / stem;
}

namespace {
// Mixture of experts and expert parallelism (moe.h, parallel.h).
template <typename Fail>
void moe_validate(const Config& c, Fail fail) {
  const int64_t data = c.dp_size * c.fs_size;
  if (c.n_experts == 0) {
    if (c.ep_size > 1)
      fail(fmt::format("key 'ep_size': value {} splits experts, but n_experts is 0 (a dense model); valid: ep_size 1, "
                       "or n_experts > 0",
                       c.ep_size));
    return;
  }
  if (c.router_lr > 0 && c.router_opt != "scalar")
    fail(fmt::format("key 'router_lr': value {} sets the routers' AdamW / Lion rate, but router_opt is '{}' (the "
                     "matrix optimizer steps them at lr); valid: router_lr 0, or router_opt scalar",
                     format_double(c.router_lr), c.router_opt));
  if (c.top_k > c.n_experts)
    fail(fmt::format("key 'top_k': value {} is more than n_experts {}; valid: 1..{}", c.top_k, c.n_experts,
                     c.n_experts));
  if (c.n_experts % c.ep_size != 0)
    fail(fmt::format("key 'n_experts': value {} is not divisible by ep_size {} (each ep rank holds n_experts / "
                     "ep_size experts); valid: a multiple of {}",
                     c.n_experts, c.ep_size, c.ep_size));
  if (data % c.ep_size != 0)
    fail(fmt::format("key 'ep_size': value {} does not divide the data-parallel ranks dp_size {} x fs_size {} = {} "
                     "(ep borrows them); valid: a divisor of {}",
                     c.ep_size, c.dp_size, c.fs_size, data, data));
  const int64_t efs = MeshShape{c.dp_size, c.fs_size, c.tp_size, c.ep_size}.efs();
  if (efs > 1 && c.n_experts % c.fs_size != 0)
    fail(fmt::format("key 'n_experts': value {} is not divisible by fs_size {}: with ep_size {} dividing fs_size, "
                     "each ep rank's {} experts are split over fs_size / ep_size = {} ranks (EP x FSDP: whole "
                     "experts on every rank); valid: n_experts a multiple of {}, or an ep_size that does not divide "
                     "fs_size (experts replicated over the data ranks)",
                     c.n_experts, c.fs_size, c.ep_size, c.n_experts / c.ep_size, efs, c.fs_size));
  if (c.n_shared_experts > 0 && (c.n_shared_experts * c.resolved_expert_dim()) % c.tp_size != 0)
    fail(fmt::format("keys 'n_shared_experts' {} x 'expert_dim' {} = {} (the shared experts' hidden size, split "
                     "over tp like the dense MLP's) is not divisible by tp_size {}; valid: a multiple of {}",
                     c.n_shared_experts, c.resolved_expert_dim(), c.n_shared_experts * c.resolved_expert_dim(),
                     c.tp_size, c.tp_size));
  // An optimizer that cannot step the expert stacks (3-D [n_experts, out, in]): its entry says why
  // (TrainEntry::moe_refusal, dion/train/optimizer_entry.h).
  if (const OptimizerChoice* o = find_optimizer(c.optimizer); o && !o->moe_refusal.empty())
    fail("key 'optimizer': " + o->moe_refusal);
  if (c.cuda_graphs)
    fail("key 'cuda_graphs': true is not supported with n_experts > 0 (the routing's token counts are read by the "
         "host every step); valid: false");
}
}  // namespace

void config_validate(const Config& c) {
  for (const Key& k : keys())
    if (const std::string error = key_error(c, k); !error.empty()) throw ConfigError(error);
  auto fail = [](const std::string& msg) { throw ConfigError(msg); };
  if (const std::string error = optimizer_error(c); !error.empty()) fail(error);
  // The products below must fit in int64 (sequence_length 2^62 x device_batch_size 4 overflowed:
  // found with tests/fuzz/fuzz_config.cpp).
  int64_t product = 1;
  for (int64_t factor : {c.device_batch_size, c.sequence_length, c.dp_size, c.fs_size, c.tp_size})
    if (__builtin_mul_overflow(product, factor, &product))
      fail(
          fmt::format("device_batch_size {} x sequence_length {} x dp_size {} x fs_size {} x tp_size {} is larger "
                      "than 2^63: one of them is far too large",
                      c.device_batch_size, c.sequence_length, c.dp_size, c.fs_size, c.tp_size));
  if (c.n_head % c.tp_size != 0)
    fail(
        fmt::format("key 'tp_size': value {} does not divide n_head {} (tensor parallelism splits the heads); "
                    "valid: a divisor of n_head",
                    c.tp_size, c.n_head));
  if (c.model_dim % c.n_head != 0)
    fail(fmt::format("key 'model_dim': value {} is not divisible by n_head {}; valid: a multiple of n_head",
                     c.model_dim, c.n_head));
  if ((c.model_dim / c.n_head) % 2 != 0)
    fail(fmt::format("model_dim {} / n_head {} = head size {} is odd; rotary embeddings need an even head size",
                     c.model_dim, c.n_head, c.model_dim / c.n_head));
  if (c.qk_clip_tau > 0 && c.qk_norm)
    fail(fmt::format("key 'qk_clip_tau': value {} needs qk_norm false: with q and k RMS-normed the logits are at most "
                     "sqrt(head size) = {:.3g} and scaling c_q or c_k changes nothing the softmax sees; valid: qk_norm "
                     "false, or qk_clip_tau 0",
                     format_double(c.qk_clip_tau), std::sqrt(double(c.model_dim / c.n_head))));
  if (c.qk_clip_tau > 0 && c.cuda_graphs)
    fail("key 'qk_clip_tau': not supported with cuda_graphs true (the attention's running max of the logits is "
         "state outside the captured graph); valid: cuda_graphs false, or qk_clip_tau 0");
  if (c.warmup_ratio + c.warmdown_ratio > 1 + 1e-12)  // (0.3 + 0.7 may round above 1)
    fail(
        fmt::format("keys 'warmup_ratio' {} + 'warmdown_ratio' {} = {} > 1: the warmup and the warmdown would "
                    "overlap; valid: a sum <= 1",
                    format_double(c.warmup_ratio), format_double(c.warmdown_ratio),
                    format_double(c.warmup_ratio + c.warmdown_ratio)));
  const int64_t dp = c.dp_size * c.fs_size;
  if (c.batch_size % (c.device_batch_size * dp) != 0)
    fail(
        fmt::format("key 'batch_size': value {} is not divisible by device_batch_size {} x data-parallel ranks {}; "
                    "valid: a multiple of {}",
                    c.batch_size, c.device_batch_size, dp, c.device_batch_size * dp));
  const int64_t val_batch = c.device_batch_size * c.sequence_length * dp;
  if (c.val_tokens % val_batch != 0)
    fail(
        fmt::format("key 'val_tokens': value {} is not a multiple of device_batch_size x sequence_length x "
                    "data-parallel ranks = {}; valid: e.g. {}",
                    c.val_tokens, val_batch, std::max<int64_t>(1, c.val_tokens / val_batch) * val_batch));
  moe_validate(c, fail);
  if (c.checkpoint_freq > 0 && c.checkpoint_dir.empty())
    fail(fmt::format("key 'checkpoint_freq': value {} needs checkpoint_dir (it is empty)", c.checkpoint_freq));
  if (c.stop_after > 0 && c.checkpoint_dir.empty())
    fail(fmt::format("key 'stop_after': value {} needs checkpoint_dir to continue from (it is empty)", c.stop_after));
  if (c.replicate_mesh_grad_sync) {
    const OptimizerChoice* o = find_optimizer(c.optimizer);
    if (!o || !o->optimizer_grad_sync) {
      std::vector<std::string> which;
      for (const OptimizerChoice& x : optimizer_catalog())
        if (x.optimizer_grad_sync) which.push_back(x.name);
      fail(fmt::format("key 'replicate_mesh_grad_sync': true is for optimizer {} only (optimizer is '{}')",
                       join_choices(which), c.optimizer));
    }
  }
  // numerics keys
  if (c.grad_clip > 0 && c.replicate_mesh_grad_sync && c.dp_size > 1)
    fail(
        fmt::format("key 'grad_clip': value {} needs the gradient summed over the dp replicas, which legacy Dion "
                    "with replicate_mesh_grad_sync never forms (dp_size {}); valid: grad_clip 0, or "
                    "replicate_mesh_grad_sync false",
                    format_double(c.grad_clip), c.dp_size));
  if (c.cuda_graphs && c.device == "cpu")  // (device auto: checked once resolved, train.cpp)
    fail(
        fmt::format("key 'cuda_graphs': true needs device cuda (a CUDA graph captures GPU work; device is '{}'); "
                    "valid: false, or device cuda",
                    c.device));
  if (c.cuda_kernels && c.device == "cpu")
    fail(
        fmt::format("key 'cuda_kernels': true needs device cuda (the kernels run on CUDA tensors; device is "
                    "'{}'); valid: false, or device cuda",
                    c.device));
  if (c.cuda_graphs && c.dp_size * c.fs_size * c.tp_size > 1)
    fail(
        fmt::format("key 'cuda_graphs': true is supported for one process only (dp_size {} x fs_size {} x "
                    "tp_size {} = {} processes): the DDP bucket all-reduces, FSDP gathers and TP all-reduces of "
                    "the step are issued from the host as the backward runs and cannot be captured; valid: false, "
                    "or dp_size = fs_size = tp_size = 1",
                    c.dp_size, c.fs_size, c.tp_size, c.dp_size * c.fs_size * c.tp_size));
}

std::string cuda_auto_dtype(int major) { return major >= 0 && major < 8 ? "fp32" : "bf16"; }

}  // namespace dion::train
